"""Checks the core's object files for instructions above the ISA each is compiled for.

usage: check_isa_objects.py OBJDUMP OBJECT...

An object named *_amx.* may use the AMX tile instructions and AVX-512, one named *_avx512.*
AVX-512, one named *_avx2.* AVX2 and FMA at most, and
every other object only the baseline x86-64 ISA (SSE2): the run-time dispatch relies on it.
Two things are checked:

1. Each object's own code stays within its level.
2. No function with vague (weak, COMDAT) linkage is defined both in an object of a lower
   level and, with instructions above that level, in an object of a higher level: the linker
   keeps one copy for every caller, so the lower-level kernel could run the higher-level copy
   (a SIGILL on a CPU without it). Inline functions and templates that do not depend on the
   per-ISA ops type need internal linkage (an unnamed namespace) to be safe.

Exits 0 with a summary line, 1 listing every offending function. On a non-x86 build, or
without objdump, it says so and exits 0: there is nothing to check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

LEVELS = {"baseline": 0, "avx2": 1, "avx512": 2, "amx": 3}

# Registers and mnemonics beyond a level: a VEX-encoded instruction (mnemonics starting with
# "v", or ymm registers) needs AVX; zmm, mask registers, xmm/ymm 16-31 and EVEX-only
# mnemonics need AVX-512.
_VEX = re.compile(r"^v|%ymm")
_EVEX = re.compile(
    r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{1to\d+\}|\{%k"
    r"|^(vpternlog|vperm[it]2|valign[dq]|vcompress|vexpand|vscalef|vrndscale|vgetexp|vgetmant"
    r"|vfixupimm|vrange|vreduce|vfpclass|vpmov\w*2m|vpmovm2|vdbpsadbw|vpconflict|vplzcnt"
    r"|vpro[lr]v?[dq]|vcvtne2ps2bf16|vcvtneps2bf16|vdpbf16ps|vpsravw|vpsrav[q]|vpsllvw|vpsrlvw"
    r"|vcvt\w*2u|vcvtu|vpmaxuq|vpminuq|vpmaxsq|vpminsq|vpabsq|vpmullq|vbroadcast[if](32x[248]"
    r"|64x[24])|vextract[if](32x[48]|64x[24])|vinsert[if](32x[48]|64x[24])|vshuf[if](32x4|64x2)"
    r"|vpbroadcastm|vpopcnt|vpshufbitqmb|vp2intersect|k\w+)"
)


def level_of(obj: Path) -> str:
    stem = obj.name.split(".")[0]
    if stem.endswith("_amx"):
        return "amx"
    if stem.endswith("_avx512"):
        return "avx512"
    if stem.endswith("_avx2"):
        return "avx2"
    return "baseline"


_AMX = re.compile(r"^(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease"
                  r"|tdp\w+)$|%tmm")


def needed(mnemonic: str, operands: str) -> str:
    text = f"{mnemonic} {operands}"
    if _AMX.search(mnemonic) or _AMX.search(operands):
        return "amx"
    if _EVEX.search(mnemonic) or _EVEX.search(operands):
        return "avx512"
    if _VEX.search(mnemonic) or _VEX.search(text):
        return "avx2"  # AVX or AVX2/FMA: both stand for "above the baseline" here
    return "baseline"


_FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
_INSN = re.compile(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$")


def disassemble(objdump: str, obj: Path) -> dict[str, tuple[str, str]]:
    """function -> (the highest level its code needs, one instruction that needs it)."""
    out = subprocess.run(
        [objdump, "-d", "-C", "--no-show-raw-insn", str(obj)],
        check=True, capture_output=True, text=True,
    ).stdout
    funcs: dict[str, tuple[str, str]] = {}
    cur = None
    for line in out.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = m.group(1)
            funcs.setdefault(cur, ("baseline", ""))
            continue
        m = _INSN.match(line)
        if not m or cur is None:
            continue
        mnemonic, operands = m.group(1), m.group(2).split("#")[0]
        lvl = needed(mnemonic, operands)
        if LEVELS[lvl] > LEVELS[funcs[cur][0]]:
            funcs[cur] = (lvl, f"{mnemonic} {operands}".strip())
    return funcs


def weak_functions(nm: str, obj: Path) -> set[str]:
    out = subprocess.run([nm, "-C", "--defined-only", str(obj)], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[1] in ("W", "u", "i"):
            names.add(parts[2])
    return names


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    # CMake may pass $<TARGET_OBJECTS> as one ;-separated argument.
    objdump = argv[1]
    objects = [Path(p) for a in argv[2:] for p in a.split(";") if p]
    nm = str(Path(objdump).with_name(Path(objdump).name.replace("objdump", "nm")))
    machine = subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()
    if machine not in ("x86_64", "amd64"):
        print(f"isa objects: nothing to check on {machine}")
        return 0
    problems: list[str] = []
    defined: dict[str, list[tuple[str, Path, str, str]]] = defaultdict(list)
    counts = defaultdict(int)
    for obj in objects:
        lvl = level_of(obj)
        counts[lvl] += 1
        funcs = disassemble(objdump, obj)
        weak = weak_functions(nm, obj)
        for name, (need, insn) in funcs.items():
            if LEVELS[need] > LEVELS[lvl]:
                problems.append(f"{obj.name} ({lvl}): {name} uses {need}: {insn}")
            if name in weak:
                defined[name].append((lvl, obj, need, insn))
    for name, copies in defined.items():
        lowest = min(LEVELS[c[0]] for c in copies)
        for lvl, obj, need, insn in copies:
            if LEVELS[need] > lowest:
                low = [c[1].name for c in copies if LEVELS[c[0]] == lowest]
                problems.append(
                    f"{name}: weak copy in {obj.name} ({lvl}) uses {need} ({insn}) and may be "
                    f"the one linked for {', '.join(low)}")
    if problems:
        for p in problems:
            print(f"FAIL {p}")
        print(f"isa objects: {len(problems)} problem(s)")
        return 1
    print(f"isa objects: {len(objects)} objects ({dict(counts)}), "
          f"{len(defined)} weak functions, every one within its ISA")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
