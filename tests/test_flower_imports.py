"""mmfl imports Flower through its public API only (issue 28): every ``flwr`` import in mmfl's
code (mmfl/, benchmarks/, scripts/), read with ``ast``, names a public module and, where the
module lists its exports, a name in its ``__all__``. There is no exception: a Flower release
that moves an internal breaks nothing of mmfl's. (tests/ is not scanned: its in-process
stand-in for the SuperLink serializes messages as the wire does, which only Flower's
internals can.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.flwr_range  # all of it runs again on the lower end of the flwr range (.ci/run)

ROOT = Path(__file__).resolve().parents[1]

# Flower's public API (https://flower.ai/docs/framework/ref-api/flwr.html): the package itself
# (its version), the Message API (flwr.app, flwr.serverapp, flwr.clientapp and their
# subpackages), the simulation entry point, and the documented flwr.server / flwr.client /
# flwr.common classes that the current SecAgg+ components are used with (DefaultWorkflow,
# LegacyContext, Strategy, SecAggPlusWorkflow; Client, ClientApp, secaggplus_mod); Flower has no
# Message-API SecAgg+.
PUBLIC = ("flwr", "flwr.app", "flwr.serverapp", "flwr.clientapp", "flwr.simulation", "flwr.server",
          "flwr.server.strategy", "flwr.server.workflow", "flwr.client", "flwr.client.mod", "flwr.common")
PUBLIC_TREES = ("flwr.app.", "flwr.serverapp.", "flwr.clientapp.")
SCANNED = ("mmfl", "benchmarks", "scripts")  # mmfl's code: what users run


def code_files():
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path


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


def test_only_public_flwr_modules():
    bad = []
    for rel, path in code_files():
        bad += [f"{rel}:{line}: {module}" for line, module, _ in flwr_imports(path) if not is_public(module)]
    assert not bad, "private flwr modules imported (use Flower's public API):\n" + "\n".join(bad)


def test_imported_names_are_exported():
    """``from flwr.X import name``: ``name`` is in ``flwr.X.__all__`` (a module, or a documented export)."""
    pytest.importorskip("flwr")
    bad = []
    for rel, path in code_files():
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


def test_no_module_is_left_for_flower_internals():
    assert not (ROOT / "mmfl" / "flower" / "_flwr_private.py").exists()


def test_the_checker_sees_a_private_import(tmp_path):
    """The check fails when the mechanism is removed: a private import is found and refused."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from flwr.proto.control_pb2 import ListRunsRequest\n    import flwr.cli.utils\n"
                 "from flwr.app import Message\n")
    found = [(m, is_public(m)) for _, m, _ in flwr_imports(f)]
    assert sorted(found) == [("flwr.app", True), ("flwr.cli.utils", False), ("flwr.proto.control_pb2", False)]
