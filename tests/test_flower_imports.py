"""mmfl imports Flower through its public API only (issue 28): every ``flwr`` import in mmfl/,
read with ``ast``, names a public module and, where the module lists its exports, a name in its
``__all__``; the one exception is mmfl/flower/_flwr_private.py (each of its entries says why no
public API serves it), so a Flower release that moves an internal breaks one file."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.flwr_range  # all of it runs again on the lower end of the flwr range (.ci/run)

ROOT = Path(__file__).resolve().parents[1]

# Flower's public API (https://flower.ai/docs/framework/ref-api/flwr.html): the Message API
# (flwr.app, flwr.serverapp, flwr.clientapp and their subpackages), the simulation entry point,
# and the documented flwr.server / flwr.client / flwr.common classes that the current SecAgg+
# components (SecAggPlusWorkflow, secaggplus_mod) are built on; Flower has no Message-API SecAgg+.
PUBLIC = ("flwr.app", "flwr.serverapp", "flwr.clientapp", "flwr.simulation", "flwr.server", "flwr.server.workflow",
          "flwr.client.mod", "flwr.common")
PUBLIC_TREES = ("flwr.app.", "flwr.serverapp.", "flwr.clientapp.")

# the one module allowed to import private flwr modules, and why (its docstring has the details)
PRIVATE_OK = {
    "mmfl/flower/_flwr_private.py": "Flower has no public API for: reply error codes, SecAgg+'s record layout "
                                    "(mmfl joins its messages to the collect stage), an in-process run status "
                                    "(Control API) and the SuperLink's middleware",
}


def flwr_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every ``flwr`` import in ``path`` (names: ``[]`` for ``import m``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "flwr"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "flwr":
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def is_public(module: str) -> bool:
    return module in PUBLIC or module.startswith(PUBLIC_TREES)


def test_only_public_flwr_modules_outside_the_private_module():
    bad = []
    for path in sorted((ROOT / "mmfl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in PRIVATE_OK:
            continue
        bad += [f"{rel}:{line}: {module}" for line, module, _ in flwr_imports(path) if not is_public(module)]
    assert not bad, ("private flwr modules imported (use the public API, or add the use to "
                     "mmfl/flower/_flwr_private.py with its reason):\n" + "\n".join(bad))


def test_imported_names_are_exported():
    """``from flwr.X import name``: ``name`` is in ``flwr.X.__all__`` (a module, or a documented export)."""
    pytest.importorskip("flwr")
    bad = []
    for path in sorted((ROOT / "mmfl").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in PRIVATE_OK:
            continue
        for line, module, names in flwr_imports(path):
            if not names or not is_public(module):
                continue
            mod = importlib.import_module(module)
            exported = set(getattr(mod, "__all__", ()))
            for name in names:
                if name not in exported and not _is_submodule(module, name):
                    bad.append(f"{rel}:{line}: {module}.{name}")
    assert not bad, "names a public flwr module does not export:\n" + "\n".join(bad)


def _is_submodule(module: str, name: str) -> bool:
    try:
        importlib.import_module(f"{module}.{name}")
        return True
    except ImportError:
        return False


def test_the_private_module_is_the_only_exception_and_still_needed():
    """The exception list names files that exist and import something private (else drop it)."""
    for rel in PRIVATE_OK:
        imports = flwr_imports(ROOT / rel)
        assert any(not is_public(m) for _, m, _ in imports), f"{rel} imports no private flwr module any more"


def test_the_checker_sees_a_private_import(tmp_path):
    """The check fails when the mechanism is removed: a private import is found and refused."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from flwr.proto.control_pb2 import ListRunsRequest\n    import flwr.cli.utils\n"
                 "from flwr.app import Message\n")
    found = [(m, is_public(m)) for _, m, _ in flwr_imports(f)]
    assert sorted(found) == [("flwr.app", True), ("flwr.cli.utils", False), ("flwr.proto.control_pb2", False)]
