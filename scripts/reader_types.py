"""How typed the readers are (issue 59's measure): of the annotations in explorer's reader
layers (ui/, why/, whatif/, export/, apps/: parameters, returns and annotated assignments),
- how many name `dict`, `Mapping` or `Any` at all (a typed map such as `dict[str, int]`, keyed
  by request id, counts here too);
- how many are loose: `Any` anywhere in them, or a bare `dict` / `Mapping` whose keys and
  values mypy cannot check (`**kwargs: Any` passed through is counted apart);
- how many name a schema type or protocol (a record's or snapshot's TypedDict, `...Dict`; a
  panel's state, `...State`; HistoryEntry, SessionView, FleetView).

    .venv/bin/python scripts/reader_types.py            # totals
    .venv/bin/python scripts/reader_types.py --files    # and the loose ones per file
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("ui", "why", "whatif", "export", "apps")
UNTYPED = re.compile(r"\b(dict|Dict|Mapping|MutableMapping|Any)\b")
LOOSE = re.compile(r"\bAny\b|\b(dict|Dict|Mapping|MutableMapping)\b(?!\[)")
SCHEMA = re.compile(r"\b([A-Z]\w*(?:Dict|State)|HistoryEntry|SessionView|FleetView)\b")


def annotations(tree: ast.AST) -> list[tuple[str, bool]]:
    """Each annotation's text, and whether it is a `**kwargs` one."""
    out: list[tuple[ast.expr, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            out += [(x.annotation, x is a.kwarg) for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                    if x is not None and x.annotation is not None]
            if node.returns is not None:
                out.append((node.returns, False))
        elif isinstance(node, ast.AnnAssign):
            out.append((node.annotation, False))
    return [(ast.unparse(x), kw) for x, kw in out]


def count(root: Path = ROOT) -> dict[str, int]:
    """The counts (see the module doc), and `file:<path>` -> that file's loose ones."""
    c = {"annotations": 0, "naming": 0, "loose": 0, "kwargs": 0, "schema": 0}
    for layer in LAYERS:
        for path in sorted((root / "explorer" / layer).rglob("*.py")):
            for text, kwargs in annotations(ast.parse(path.read_text())):
                c["annotations"] += 1
                c["schema"] += bool(SCHEMA.search(text))
                c["naming"] += bool(UNTYPED.search(text))
                if kwargs and LOOSE.search(text):
                    c["kwargs"] += 1
                elif LOOSE.search(text):
                    c["loose"] += 1
                    key = f"file:{path.relative_to(root)}"
                    c[key] = c.get(key, 0) + 1
    return c


def main() -> None:
    c = count()
    n = max(c["annotations"], 1)
    print(f"{c['annotations']} annotations in explorer/{{{','.join(LAYERS)}}}:\n"
          f"  {c['naming']} name dict, Mapping or Any ({100 * c['naming'] / n:.1f}%)\n"
          f"  {c['loose']} are loose: Any, or a bare dict or Mapping ({100 * c['loose'] / n:.1f}%), "
          f"besides {c['kwargs']} **kwargs: Any\n"
          f"  {c['schema']} name a schema type or protocol ({100 * c['schema'] / n:.1f}%)")
    if "--files" in sys.argv:
        files = {k[5:]: v for k, v in c.items() if k.startswith("file:")}
        for name, v in sorted(files.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{v:5d}  {name}")


if __name__ == "__main__":
    main()
