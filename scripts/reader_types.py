"""How typed the readers are (issue 59's measure): of the annotations in explorer's reader
layers (ui/, why/, whatif/, export/, apps/: parameters, returns and annotated assignments),
how many name `dict`, `Mapping` or `Any`, and how many name a schema type or protocol (a
record's or snapshot's TypedDict, `...Dict`; a panel's state, `...State`; HistoryEntry,
SessionView, FleetView).

    .venv/bin/python scripts/reader_types.py            # totals
    .venv/bin/python scripts/reader_types.py --files    # and the untyped count per file
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("ui", "why", "whatif", "export", "apps")
UNTYPED = re.compile(r"\b(dict|Dict|Mapping|MutableMapping|Any)\b")
SCHEMA = re.compile(r"\b([A-Z]\w*(?:Dict|State)|HistoryEntry|SessionView|FleetView)\b")


def annotations(tree: ast.AST) -> list[str]:
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            out += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                    if x is not None and x.annotation is not None]
            if node.returns is not None:
                out.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            out.append(node.annotation)
    return [ast.unparse(x) for x in out]


def count(root: Path = ROOT) -> tuple[int, int, int, dict[str, int]]:
    """(annotations, untyped ones, schema-typed ones, untyped per file)."""
    total = untyped = schema = 0
    per: dict[str, int] = {}
    for layer in LAYERS:
        for path in sorted((root / "explorer" / layer).rglob("*.py")):
            for text in annotations(ast.parse(path.read_text())):
                total += 1
                schema += bool(SCHEMA.search(text))
                if UNTYPED.search(text):
                    untyped += 1
                    name = str(path.relative_to(root))
                    per[name] = per.get(name, 0) + 1
    return total, untyped, schema, per


def main() -> None:
    total, untyped, schema, per = count()
    print(f"{total} annotations in explorer/{{{','.join(LAYERS)}}}: {untyped} name dict, Mapping or Any "
          f"({100 * untyped / max(total, 1):.1f}%), {schema} name a schema type or protocol")
    if "--files" in sys.argv:
        for name, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{n:5d}  {name}")


if __name__ == "__main__":
    main()
