"""The packages' import graph: one direction, no cycles, nothing shipped imports tests/ or
benchmarks/ (neither is in the wheel).

Every import counts, lazy ones inside functions included: a lazy import only hides a
cycle from the interpreter, not from a reader. The graph is read from the source (ast),
so nothing is imported to check it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "explorer", "widgets", "benchmarks")
SHIPPED = ("engine", "explorer", "widgets")
# engine <- explorer -> widgets (docs/architecture.md): who may import whom; the benchmarks use them all.
ALLOWED = {"engine": {"engine"}, "widgets": {"widgets"}, "explorer": {"engine", "explorer", "widgets"},
           "benchmarks": {"engine", "explorer", "widgets", "benchmarks"}}
# engine/core decides what the vLLM differential tests compare: plain Python, no torch.
TORCH_FREE = ("engine.core",)
# Inside the engine, arrows that must never exist (docs/architecture.md's layers): the decisions
# reach nothing with tensors; the runner never drives the tensor-parallel processes (they drive
# it); the tensor-parallel primitives never import the model (the model imports them).
TENSOR_FOLDERS = ("engine.runner", "engine.model", "engine.attention", "engine.parallel", "engine.executor",
                  "engine.cpu_kernels")
FORBIDDEN = [("engine.core", f) for f in TENSOR_FOLDERS] + [
    ("engine.runner", "engine.executor"),
    ("engine.parallel", "engine.model"),
    ("engine.parallel", "engine.runner"),
    ("engine.parallel", "engine.executor"),
]
# explorer/'s layers, bottom to top (docs/architecture.md): a module imports its own layer and
# the ones below, never one above. The package's own __init__ and __main__ are the top: they
# name what a user imports.
EXPLORER_LAYERS = ("explorer.drivers", "explorer.core", "explorer.whatif", "explorer.why", "explorer.ui",
                   "explorer.export", "explorer.apps")


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Absolute names of everything `name` imports (modules where they are modules)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ re-exports its modules; a module importing a sibling through the
    # package name is the same edge as importing the sibling itself.
    packages = {n for n in graph if (ROOT / n.replace(".", "/") / "__init__.py").exists()}
    return {n: {d for d in deps if d not in packages or d == n.split(".")[0]} for n, deps in graph.items()}


KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles_between_modules():
    cycles = [c for c in _cycles(_without_package_inits(_graph())) if c not in KNOWN_CYCLES]
    assert not cycles, "import cycles (lazy imports count):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, deps in graph.items():
        top = name.split(".")[0]
        for dep in deps:
            dep_top = dep.split(".")[0]
            reaches_unshipped = top in SHIPPED and dep_top in ("tests", "benchmarks")
            if reaches_unshipped or (dep_top in PACKAGES and dep_top not in ALLOWED[top]):
                bad.append(f"{name} imports {dep}")
    return sorted(bad)


def test_imports_follow_engine_explorer_widgets_and_never_reach_tests_or_benchmarks():
    bad = _layer_violations(_graph())
    assert not bad, "\n".join(bad)


def test_engine_core_imports_no_torch():
    graph = _graph()
    core = [n for n in graph if n.startswith(TORCH_FREE)]
    assert core, "engine/core is missing"
    heavy = [f"{n} imports {d}" for n in core for d in graph[n] if d.split(".")[0] in ("torch", "numpy")]
    assert not heavy, "\n".join(heavy)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
    def inside(name: str, folder: str) -> bool:
        return name == folder or name.startswith(folder + ".")

    return sorted(f"{name} imports {dep}" for name, deps in graph.items() for dep in deps
                  for src, dst in FORBIDDEN if inside(name, src) and inside(dep, dst))


def test_the_engine_folders_point_one_way():
    for folder in {f for pair in FORBIDDEN for f in pair}:
        path = ROOT / folder.replace(".", "/")
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"{folder} is missing"
    bad = _wrong_arrows(_graph())
    assert not bad, "\n".join(bad)


def test_a_planted_wrong_arrow_is_found():
    graph = _graph()
    graph["engine.runner.model_runner"] = graph["engine.runner.model_runner"] | {"engine.executor.executor"}
    graph["engine.parallel.sharding"] = graph["engine.parallel.sharding"] | {"engine.model.spec"}
    assert _wrong_arrows(graph) == ["engine.parallel.sharding imports engine.model.spec",
                                    "engine.runner.model_runner imports engine.executor.executor"]


def _explorer_layer(name: str) -> int | None:
    for rank, folder in enumerate(EXPLORER_LAYERS):
        if name == folder or name.startswith(folder + "."):
            return rank
    return len(EXPLORER_LAYERS) if name.split(".")[0] == "explorer" else None


def _upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for name, deps in graph.items():
        rank = _explorer_layer(name)
        if rank is None:
            continue
        for dep in deps:
            dep_rank = _explorer_layer(dep)
            if dep_rank is not None and dep_rank > rank and dep != "explorer":
                out.append(f"{name} ({EXPLORER_LAYERS[rank]}) imports {dep}")
    return sorted(out)


def test_explorer_layers_point_down_and_explorer_has_no_cycle():
    for folder in EXPLORER_LAYERS:
        assert (ROOT / folder.replace(".", "/") / "__init__.py").is_file(), f"{folder} is missing"
    graph = _graph()
    upward = _upward_arrows(graph)
    assert not upward, "upward imports in explorer/:\n" + "\n".join(upward)
    explorer_cycles = [c for c in _cycles(_without_package_inits(graph)) if c[0].startswith("explorer")]
    assert not explorer_cycles, explorer_cycles


def test_a_planted_upward_import_is_found():
    graph = _graph()
    graph["explorer.drivers.vllm.records"] = graph["explorer.drivers.vllm.records"] | {"explorer.ui.views"}
    graph["explorer.core.history"] = graph["explorer.core.history"] | {"explorer.export.page"}
    assert _upward_arrows(graph) == [
        "explorer.core.history (explorer.core) imports explorer.export.page",
        "explorer.drivers.vllm.records (explorer.drivers) imports explorer.ui.views"]


def test_a_shipped_module_importing_the_benchmarks_is_found():
    graph = _graph()
    graph["explorer.apps.cli"] = graph["explorer.apps.cli"] | {"benchmarks.offline"}
    assert _layer_violations(graph) == ["explorer.apps.cli imports benchmarks.offline"]


def test_the_wheel_ships_the_drivers_and_not_the_benchmarks():
    import tomllib
    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = set(find_packages(str(ROOT), include=include))
    assert {"explorer.drivers", "explorer.drivers.vllm_live", "engine.runner"} <= shipped
    assert not [p for p in shipped if p.split(".")[0] in ("benchmarks", "tests")]
