"""Structural measures of the source tree, as JSON, for a design review to compare over time.

    python scripts/arch_metrics.py [--root .]

- `code_files_over_400`: Python and C++/CUDA files under python/ and csrc/ longer than 400 lines
  (tests and scripts are listed apart: they may be longer where a file holds one subject).
- `any_at_boundaries`: `Any` in the annotations a module shows to others: the parameters and
  return types of its public functions and of its public classes' public methods, and the
  annotated fields of its public classes. Names starting with `_` are private and not counted.
  `bare_any_at_boundaries` counts only annotations that are `Any` itself (or `Any | None`):
  an object whose type the module does not say, as `srv: Any`; `dict[str, Any]` for JSON
  is not counted there.
- `dialect_imports`: imports from one API dialect package (server/api/<dialect>/) into code
  outside it, by importing package; siblings importing each other is what a neutral chat
  core removes.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

CODE_SUFFIXES = {".py", ".cpp", ".h", ".c", ".cu", ".cuh"}
DIALECTS = ("openai", "anthropic", "scale_out")


def lines(path: Path) -> int:
    return sum(1 for _ in path.open(encoding="utf-8", errors="replace"))


def long_files(root: Path, folders: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for folder in folders:
        for p in sorted((root / folder).rglob("*")):
            if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.is_file():
                n = lines(p)
                if n > 400:
                    out[str(p.relative_to(root))] = n
    return out


def _any_in(node: ast.AST | None) -> int:
    if node is None:
        return 0
    return sum(1 for n in ast.walk(node)
               if (isinstance(n, ast.Name) and n.id == "Any")
               or (isinstance(n, ast.Attribute) and n.attr == "Any")
               or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and "Any" in n.value.replace("AnyStr", "")))


def _bare_any(node: ast.AST | None) -> int:
    """1 when the annotation is Any itself (or Any | None): an object whose type is not
    said, as opposed to Any inside a JSON container such as dict[str, Any]."""
    if node is None:
        return 0
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value.replace(" ", "")
        return int(text in ("Any", "Any|None", "None|Any", "Optional[Any]"))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        if any(isinstance(x, ast.Constant) and x.value is None for x in sides):
            return max(_bare_any(x) for x in sides)
        return 0
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
            node.value.id == "Optional":
        return _bare_any(node.slice)
    return int((isinstance(node, ast.Name) and node.id == "Any")
               or (isinstance(node, ast.Attribute) and node.attr == "Any"))


def _annotations(path: Path) -> list[ast.AST]:
    """The annotations a module shows others: public functions' and public classes' public
    methods' parameters and returns, public classes' annotated fields."""
    out: list[ast.AST] = []

    def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        a = fn.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
        out.extend(p.annotation for p in params if p is not None and p.annotation)
        if fn.returns is not None:
            out.append(fn.returns)

    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                not node.name.startswith("_"):
            signature(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not item.name.startswith("_") or item.name == "__init__"):
                    signature(item)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                        and not item.target.id.startswith("_"):
                    out.append(item.annotation)
    return out


def boundary_any(path: Path) -> int:
    return sum(_any_in(a) for a in _annotations(path))


def boundary_bare_any(path: Path) -> int:
    return sum(_bare_any(a) for a in _annotations(path))


def dialect_imports(root: Path) -> dict[str, int]:
    counts: Counter[str] = Counter()
    base = root / "python"
    for p in base.rglob("*.py"):
        rel = p.relative_to(base).with_suffix("")
        mod = ".".join(rel.parts)
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                pkg_parts = rel.parts[:-1]  # the package of a module and of an __init__
                if node.level:  # relative: resolve against the importing module's package
                    up = pkg_parts[:len(pkg_parts) - node.level + 1]
                    names = [".".join([*up, *([node.module] if node.module else [])])]
                else:
                    names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                for d in DIALECTS:
                    pkg = f"server.api.{d}"
                    if (name == pkg or name.startswith(pkg + ".")) and not mod.startswith(pkg):
                        counts[f"{'.'.join(rel.parts[:3])} -> {pkg}"] += 1
    return dict(sorted(counts.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path)
    root = ap.parse_args().root
    per_file = {str(p.relative_to(root)): n for p in sorted((root / "python").rglob("*.py"))
                if (n := boundary_any(p))}
    bare = {str(p.relative_to(root)): n for p in sorted((root / "python").rglob("*.py"))
            if (n := boundary_bare_any(p))}
    code = long_files(root, ("python", "csrc"))
    print(json.dumps({
        "code_files_over_400": code,
        "code_files_over_400_count": len(code),
        "tests_and_scripts_over_400": long_files(root, ("tests", "scripts")),
        "any_at_boundaries": sum(per_file.values()),
        "any_at_boundaries_top": dict(sorted(per_file.items(), key=lambda kv: -kv[1])[:15]),
        "bare_any_at_boundaries": sum(bare.values()),
        "bare_any_at_boundaries_top": dict(sorted(bare.items(), key=lambda kv: -kv[1])[:15]),
        "dialect_imports": dialect_imports(root),
        "python_files": sum(1 for _ in (root / "python").rglob("*.py")),
        "csrc_src_top_level_files": sum(1 for p in (root / "csrc" / "src").iterdir()
                                        if p.is_file()),
    }, indent=1))


if __name__ == "__main__":
    main()
