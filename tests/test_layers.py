"""The import rule (docs/architecture.md, "Layers"): every module imports only from its own
layer or the layers below it, at module level and inside functions alike, so no import
anywhere exists to dodge a cycle.

    base (errors, registry, schema, seeds, report) -> data -> models -> core -> algorithms
    -> engine -> config -> apps (api, cli, flower, sweep, bench, vqa_eval)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "mmfl"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("mmfl.errors", "mmfl.registry", "mmfl.schema", "mmfl.schema_trust", "mmfl.schema_tools", "mmfl.seeds",
              "mmfl.report", "mmfl.config_raw", "mmfl._version")),
    ("data", ("mmfl.data",)),
    ("models", ("mmfl.models",)),
    ("core", ("mmfl.core",)),
    ("algorithms", ("mmfl.algorithms",)),
    ("engine", ("mmfl.engine",)),
    ("config", ("mmfl.config",)),
    ("apps", ("mmfl.api", "mmfl.audit", "mmfl.bench_args", "mmfl.reference", "mmfl.reference_sklearn", "mmfl.cli", "mmfl.convert", "mmfl.flower",
              "mmfl.sweep", "mmfl.bench", "mmfl.vqa_eval")),
]
FACADE = "mmfl"  # mmfl/__init__.py: load_config / Experiment on first attribute access (PEP 562)


def layer_of(module: str) -> int:
    """Index in LAYERS of the layer holding ``module`` (a dotted mmfl module name)."""
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module}: in no layer; add it to LAYERS in tests/test_layers.py "
                         "and to docs/architecture.md")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, module)`` of every mmfl import in ``path``: module level and in functions,
    absolute and relative."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "mmfl"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "mmfl":
                out.append((node.lineno, mod))
    return out


def all_modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_every_module_is_in_a_layer():
    for path in all_modules():
        name = module_name(path)
        if name != FACADE:
            layer_of(name)


def test_imports_point_down_only():
    upward = []
    for path in all_modules():
        me = module_name(path)
        if me == FACADE:
            continue
        mine = layer_of(me)
        for line, target in imported_modules(path):
            if target == FACADE:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line}: imports the package facade 'mmfl'")
            elif layer_of(target) > mine:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line}: {me} ({LAYERS[mine][0]}) imports "
                              f"{target} ({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports pointing up:\n" + "\n".join(upward)


def test_the_rule_catches_an_upward_import(tmp_path):
    """The check itself: an import inside a function of a core module that reaches the runtime
    is found, relative imports resolve, and the runtime is a higher layer than core."""
    bad = tmp_path / "mmfl" / "core"
    bad.mkdir(parents=True)
    (bad / "x.py").write_text("def f():\n    from mmfl.engine.runner import Experiment\n"
                              "from ..engine import checkpoint\n")
    found = imported_modules(bad / "x.py", tmp_path / "mmfl")
    assert sorted(found) == [(2, "mmfl.engine.runner"), (3, "mmfl.engine")]
    assert module_name(bad / "x.py", tmp_path / "mmfl") == "mmfl.core.x"
    assert all(layer_of(t) > layer_of("mmfl.core.x") for _, t in found)


@pytest.mark.parametrize("comment", ["cycle", "circular", "lazy: the simulation", "not at import"])
def test_no_import_comment_names_a_cycle(comment):
    hits = [f"{p.relative_to(ROOT.parent)}:{i}" for p in all_modules()
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if "import" in line and "#" in line and comment in line.split("#", 1)[1]]
    assert not hits, f"imports whose comment names a cycle ({comment!r}): {hits}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the mmfl modules it imports (``from mmfl.core import dp`` names the submodule
    ``mmfl.core.dp`` where one exists), the package facade left out."""
    names = {module_name(p) for p in all_modules()}
    graph: dict[str, set[str]] = {}
    for path in all_modules():
        me = module_name(path)
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        for line, target in imported_modules(path):
            targets.add(target)
        for node in ast.walk(tree):  # from package import submodule
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "") in names:
                targets |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in names}
        graph[me] = {t for t in targets if t in names and t not in (me, FACADE)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without a package's edges to its own submodules (``__init__`` re-exports:
    importing ``a.b`` runs ``a`` first by Python's rules, which is no cycle of ours)."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}


def test_no_import_cycle_inside_a_layer():
    """Issue 28: aggregation, robust, streaming and dp imported each other, so importing
    ``mmfl.core.robust`` first failed; the direction check cannot see a circle inside a layer."""
    found = cycles(package_parents(import_graph()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each mmfl module imported first, with no other mmfl module loaded (one interpreter,
    ``sys.modules`` cleared of mmfl between imports: torch and the rest stay loaded)."""
    import subprocess
    import sys
    names = sorted(module_name(p) for p in all_modules())
    script = ("import importlib, sys\nbad = []\nfor n in sys.argv[1:]:\n"
              "    for k in [k for k in sys.modules if k == 'mmfl' or k.startswith('mmfl.')]:\n"
              "        del sys.modules[k]\n"
              "    try:\n        importlib.import_module(n)\n"
              "    except Exception as e:\n        bad.append(f'{n}: {type(e).__name__}: {e}')\n"
              "print('\\n'.join(bad))\nsys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", script, *names], cwd=ROOT.parent, capture_output=True, text=True)
    assert proc.returncode == 0, "modules that fail to import alone:\n" + proc.stdout + proc.stderr[-2000:]


def test_one_module_name_per_idea_across_core_and_engine():
    """Issue 28: ``state``, ``dp`` and ``batched`` were each two modules (core's declared algorithm
    state, DP math and stacked training; engine's client-state stores, DP runtime and batched
    delivery). A module name in mmfl/core and mmfl/engine (its stages included) names one idea."""
    seen: dict[str, list[str]] = {}
    for layer in ("core", "engine"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            if path.name != "__init__.py":
                seen.setdefault(path.stem, []).append(module_name(path))
    twice = {stem: mods for stem, mods in seen.items() if len(mods) > 1}
    assert not twice, f"module names used twice across core and engine: {twice}"
