"""The AMX-BF16 tile kernel of the packed bf16 linear against the scalar kernel, its batch
invariance, and the fallback to AVX-512 when the kernel refuses the tile state.

The tile kernel rounds the activations to bf16 (as the AVX512_BF16 kernel does) and sums
bf16 products in fp32 tiles, so it is compared with the scalar kernel run on the same
bf16-rounded activations: only the fp32 accumulation differs, within 1e-5 of sum |x| |w|
(plus one bf16 ulp of the result for a bf16 out). The shapes cover M below, at and past a
16-row tile, N with partial and odd panel counts, and K not a multiple of the 32-deep tile.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import llmcore
import pytest
import torch

MS = [1, 2, 15, 16, 17, 64, 255, 300]
NS = [16, 40, 576, 1000]
KS = [32, 48, 576, 1536, 100]


def _amx_or_skip(isa_record: Any) -> None:
    if llmcore.isa.set_isa("linear", "amx") != "amx":
        why = f"this CPU (or this process) cannot use the AMX tiles: runs {llmcore.cpu_isa()}"
        isa_record.skipped("linear", "amx", why)
        pytest.skip(f"linear amx not run: {why}")


def _case(n: int, k: int, m: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    return w, x, bias


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", MS)
def test_tile_kernel_matches_scalar(m: int, k: int, isa_record: Any) -> None:
    for i, n in enumerate(NS):
        w, x, bias = _case(n, k, m, seed=m * 7919 + k * 31 + n)
        packed = llmcore.PackedWeight(w)
        xr = x.bfloat16().float()  # the activations the tile kernel multiplies
        with llmcore.isa.capped("scalar", ("linear",)):
            ref = llmcore.linear(xr, packed, None, torch.empty(m, n))
        scale = xr.double().abs() @ w.double().abs().T + bias.double().abs()
        with llmcore.isa.capped("amx", ("linear",)):
            _amx_or_skip(isa_record)
            for with_bias in (False, True):
                for out_dtype in (torch.float32, torch.bfloat16):
                    out = torch.empty(m, n, dtype=out_dtype)
                    llmcore.linear(x, packed, bias if with_bias else None, out)
                    want = (ref + bias if with_bias else ref).double()
                    tol = 1e-5 * scale + 1e-6
                    if out_dtype == torch.bfloat16:
                        tol = tol + want.abs() * 2.0**-7  # one bf16 ulp of the result
                    err = (out.double() - want).abs()
                    case = f"m={m} n={n} k={k} bias={with_bias} out={out_dtype}"
                    assert bool((err <= tol).all()), f"{case}: max error {err.max().item():.3g}"
    isa_record.ran("linear", "amx")


@pytest.mark.parametrize(("n", "k"), [(576, 576), (40, 100), (1000, 48)])
def test_tile_kernel_is_batch_invariant(n: int, k: int, isa_record: Any) -> None:
    """Row r of an M = 64 product is, to the bit, that row computed alone (M = 1, where the
    tiles are configured with one row), and any subset of rows in any order (M = 17: a full
    tile and a zero-padded one)."""
    w, x, bias = _case(n, k, 64, seed=n + k)
    packed = llmcore.PackedWeight(w)
    with llmcore.isa.capped("amx", ("linear",)):
        _amx_or_skip(isa_record)
        whole = llmcore.linear(x, packed, bias, torch.empty(64, n))
        for r in range(64):
            alone = llmcore.linear(x[r:r + 1].contiguous(), packed, bias, torch.empty(1, n))
            assert torch.equal(alone[0], whole[r]), r
        rows = [40, 3, 63, 17, 0, 8, 9, 10, 11, 12, 13, 14, 15, 16, 31, 32, 33]
        part = llmcore.linear(x[rows].contiguous(), packed, bias, torch.empty(len(rows), n))
        assert torch.equal(part, whole[rows])
    isa_record.ran("linear", "amx")


# A child that forbids arch_prctl(ARCH_REQ_XCOMP_PERM, ...) with EPERM (a seccomp filter, as a
# container runtime may install) before llmcore is imported, then checks what the core chose.
_CHILD = textwrap.dedent("""
    import ctypes, errno, struct, sys

    def stmt(code, k):
        return struct.pack("HBBI", code, 0, 0, k)

    def jump(code, k, jt, jf):
        return struct.pack("HBBI", code, jt, jf, k)

    LD_W_ABS, JEQ_K, RET_K = 0x20, 0x15, 0x06
    AUDIT_ARCH_X86_64, SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM = 0xC000003E, 158, 0x1023
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    prog = b"".join([
        stmt(LD_W_ABS, 4),                               # seccomp_data.arch
        jump(JEQ_K, AUDIT_ARCH_X86_64, 0, 5),
        stmt(LD_W_ABS, 0),                               # .nr
        jump(JEQ_K, SYS_ARCH_PRCTL, 0, 3),
        stmt(LD_W_ABS, 16),                              # .args[0], low half
        jump(JEQ_K, ARCH_REQ_XCOMP_PERM, 0, 1),
        stmt(RET_K, ERRNO | errno.EPERM),
        stmt(RET_K, ALLOW),
    ])
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    fbuf = ctypes.create_string_buffer(fprog)
    if (libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fbuf, 0, 0) != 0):
        print("NO-SECCOMP", ctypes.get_errno())
        sys.exit(0)
    # The filter is in force: the request fails here as it will inside the core.
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                      ctypes.c_long(18))
    assert rc == -1 and ctypes.get_errno() == errno.EPERM, (rc, ctypes.get_errno())

    import llmcore, torch
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(300, 576, generator=gen) * 0.05).bfloat16()
    x = torch.randn(37, 576, generator=gen)
    got = llmcore.linear(x, llmcore.PackedWeight(w), None, torch.empty(37, 300))
    xr = x.bfloat16().double()
    scale = xr.abs() @ w.double().abs().T
    err = (got.double() - xr @ w.double().T).abs()
    assert bool((err <= 1e-5 * scale + 1e-6).all()), err.max().item()
    print("ISA", llmcore.cpu_isa(), llmcore.isa.current()["linear"])
""")


def test_tiles_refused_falls_back_to_avx512() -> None:
    """Where the kernel refuses the tile state (arch_prctl fails), the core runs AVX-512 and
    the packed bf16 linear its vdpbf16ps kernel, with the right products."""
    if llmcore.cpu_isa() != "amx":
        pytest.skip(f"this CPU runs {llmcore.cpu_isa()} at most: no AMX to refuse, nothing to prove")
    res = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    if res.stdout.startswith("NO-SECCOMP"):
        pytest.skip(f"seccomp filters are unavailable here (errno {res.stdout.split()[1]})")
    assert res.stdout.split()[-3:] == ["ISA", "avx512", "avx512"], res.stdout
