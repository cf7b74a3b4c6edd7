"""docs/architecture.md's recipe, "Adding an algorithm": one file (plus its test, doc page and grid
line) and nothing else. A throwaway algorithm is written as a module in a temporary folder and
imported (it registers itself, as a file of mmfl/algorithms would); then the suite's lists that
cover every algorithm pick it up without an edit (they read the registry and the server's declared
``runs_on``), the doc's quoted `mmfl list` output does not change, and it runs, streamed, through
the server-step hook (``FedAvgServer.server_step``) without overriding ``aggregate``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
import torch

from mmfl.algorithms import ALGORITHMS

from helpers import experiment, rows

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from docs_numbers import list_lines  # noqa: E402

try:
    import registry_cases
    import test_device
    import test_manifest_missing_runs
except ImportError:  # tests/ imported as a package
    from tests import registry_cases, test_device, test_manifest_missing_runs

NAME = "recipe_half_step"
MODULE = f'''"""A throwaway algorithm: FedAvg whose server moves half way to the clients' average."""
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.algorithms.registry import register


class HalfStepServer(FedAvgServer):
    def server_step(self, rnd, previous, averaged):
        return {{k: previous[k] + 0.5 * (a - previous[k]) if a.is_floating_point() else a
                 for k, a in averaged.items()}}


register("{NAME}", FedAvgParams, HalfStepServer, FedAvgClient, help="recipe test: half a FedAvg step")
'''


@pytest.fixture
def added(tmp_path, monkeypatch):
    """The registry with the throwaway module imported (restored afterwards)."""
    monkeypatch.setattr(ALGORITHMS, "_entries", dict(ALGORITHMS._entries))
    path = tmp_path / "recipe_half_step.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("recipe_half_step", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert NAME in ALGORITHMS
    return tmp_path


def test_the_lists_that_cover_every_algorithm_pick_it_up(added):
    assert NAME in registry_cases.shipped() and registry_cases.runs_on(NAME) == "single"
    case = test_device.registered_cases()[NAME]
    assert case["algorithm"] == {"name": NAME} and case["data"] == {"name": "digits"}
    assert NAME in test_manifest_missing_runs.registered_cases()


def test_the_docs_quote_does_not_change(added):
    from mmfl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["list", "algorithm"]) == 0
    assert f"  {NAME} " in out.getvalue()  # `mmfl list` shows it ...
    record = json.loads((ROOT / "tests" / "docs_numbers.json").read_text())["list"]
    assert list_lines(out.getvalue()) == record  # ... and the doc's quoted lines stay the same


def test_it_runs_streamed_through_the_server_step_hook(added):
    raw = {**test_device.registered_cases()[NAME], "name": "recipe", "device": "cpu",
           "output_dir": str(added / "runs"), "stream_aggregation": "on"}
    exp = experiment(raw)
    before = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    exp.run()
    assert [r["replies_streamed"] for r in rows(exp)] == [3, 3]  # the fold, then server_step
    assert any(not torch.equal(before[k], v) for k, v in exp.server.model.state_dict().items())
