"""Resuming a Flower run: the server's state from the run folder's checkpoint, the clients'
state from the SuperNodes' ``state-dir`` (Flower's context.state is per run and in memory,
so a resumed run, a new ``flwr run``, starts with an empty one). A resumed run must equal the
uninterrupted run of the simulator bit for bit (tests/test_flower.py shows Flower runs equal
the simulator exactly, and so does the simulator's own resume)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

from mmfl.engine.runner import Experiment  # noqa: E402
from mmfl.errors import MMFLError  # noqa: E402
from mmfl.flower.deploy import LocalDeployment  # noqa: E402
from mmfl.flower.node_state import NodeStateDir  # noqa: E402
from mmfl.flower.transport import FlowerTransport  # noqa: E402

try:
    from test_flower import InProcessGrid, assert_same_run, cfg_of, finished, rows, simulator_run
except ImportError:  # run as the package tests.*
    from tests.test_flower import InProcessGrid, assert_same_run, cfg_of, finished, rows, simulator_run

SCAFFOLD = ["algorithm.name=scaffold"]  # client control variates: state that must survive the resume


def nodes_with_state(state_dir: Path | None) -> dict[int, dict]:
    extra = {} if state_dir is None else {"state-dir": str(state_dir)}
    return {11: {"partition-id": 0, "num-partitions": 2, **extra}, 22: {"partition-id": 1, "num-partitions": 2, **extra}}


def grid_experiment(tmp_path, rounds: int, state_dir: Path | None, *over, resume: bool = False) -> Path:
    """A run on a fresh in-process grid (new Flower contexts: as a new ``flwr run``)."""
    cfg = cfg_of(tmp_path / "grid", "resumed", *SCAFFOLD, f"rounds={rounds}", *over)
    grid = InProcessGrid(cfg.to_toml(), nodes_with_state(state_dir))
    Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(
        grid, e.federation, cfg.run, wait_for_nodes_s=0, state_file=cfg.run_dir / "flower_state.json")
    ).run(resume=resume)
    return cfg.run_dir


def test_node_state_first_message_of_a_round_reads_an_earlier_round_and_drops_later_versions(tmp_path):
    store = NodeStateDir(tmp_path, "ab" * 16, keep=1)
    one, two = {"c": torch.ones(2)}, {"c": torch.full((2,), 2.0)}
    store.save(3, 0, one)
    store.save(3, 1, two)  # round 1 was interrupted after this client's message
    assert torch.equal(store.load(3, 1, call=0)["c"], one["c"])  # round 1 again: the state after round 0
    assert not (store.dir / "c3" / "r000001.safetensors").exists()
    store.save(3, 1, two)
    assert torch.equal(store.load(3, 1, call=1)["c"], two["c"])  # the round's second message: round 1's
    for r in range(2, 6):
        store.save(3, r, {"c": torch.full((2,), float(r))})
    assert sorted(p.name for p in (store.dir / "c3").iterdir()) == \
        ["r000003.safetensors", "r000004.safetensors", "r000005.safetensors"]  # pruned
    assert store.load(7, 4, call=0) == {}


def test_resumed_grid_run_with_client_state_equals_uninterrupted_simulator(tmp_path):
    # 2 rounds, then a new Flower run resumes the folder with rounds = 3; SCAFFOLD's control
    # variates come back from the nodes' state-dir (the new run's context.state is empty)
    state = tmp_path / "node_state"
    grid_experiment(tmp_path, 2, state)
    run = grid_experiment(tmp_path, 3, state, resume=True)
    assert [r["round"] for r in rows(run)] == [1, 2, 3]
    assert_same_run(run, simulator_run(tmp_path, "resumed", *SCAFFOLD, "rounds=3"))


def test_resume_after_an_interrupted_round_drops_the_nodes_newer_state(tmp_path):
    # the run got through round 3 on the nodes, but its checkpoint of round 3 is lost (a crash
    # between the clients' replies and the checkpoint): the resume from round 2's checkpoint must
    # not use the clients' round-3 state
    state = tmp_path / "node_state"
    run = grid_experiment(tmp_path, 3, state, "keep_checkpoints=2")
    shutil.rmtree(run / "checkpoints" / "round_00003")
    (run / "checkpoints" / "LATEST").write_text("round_00002")
    grid_experiment(tmp_path, 3, state, "keep_checkpoints=2", resume=True)
    assert_same_run(run, simulator_run(tmp_path, "resumed", *SCAFFOLD, "rounds=3", "keep_checkpoints=2"))


def test_resume_without_node_state_dir_is_refused_in_one_line(tmp_path):
    grid_experiment(tmp_path, 2, None)
    with pytest.raises(MMFLError, match=r"cannot resume: client\(s\) \[0, 1, 2\] keep state .*state-dir"):
        grid_experiment(tmp_path, 3, None, resume=True)


def test_resume_on_a_node_that_lost_its_state_is_refused(tmp_path):
    state = tmp_path / "node_state"
    grid_experiment(tmp_path, 2, state)
    shutil.rmtree(state)  # e.g. the SuperNode moved to another machine
    with pytest.raises(MMFLError, match=r"client 0 kept state before round 3 .* has none under"):
        grid_experiment(tmp_path, 3, state, resume=True)


def test_a_fresh_run_never_reads_an_older_runs_node_state(tmp_path):
    state = tmp_path / "node_state"
    grid_experiment(tmp_path, 2, state)
    first = json.loads((tmp_path / "grid" / "resumed" / "flower_state.json").read_text())["state_id"]
    cfg = cfg_of(tmp_path / "grid", "resumed", *SCAFFOLD, "rounds=2")
    grid = InProcessGrid(cfg.to_toml(), nodes_with_state(state))
    Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(
        grid, e.federation, cfg.run, wait_for_nodes_s=0, state_file=cfg.run_dir / "flower_state.json")
    ).run(overwrite=True)
    assert json.loads((cfg.run_dir / "flower_state.json").read_text())["state_id"] != first
    assert_same_run(cfg.run_dir, simulator_run(tmp_path, "resumed", *SCAFFOLD, "rounds=2"))


@pytest.mark.slow
def test_loopback_scaffold_resumed_by_a_new_deployment_equals_simulator(tmp_path):
    # real processes: 2 rounds on one SuperLink + 3 SuperNodes, all stopped; a new SuperLink and
    # new SuperNodes (same state-dir) resume the run folder with rounds = 3
    state = tmp_path / "node_state"
    cfg2 = cfg_of(tmp_path / "flower", "scaffold", *SCAFFOLD, "rounds=2")
    with LocalDeployment(3, tmp_path / "dep1", state_dir=state) as dep:
        finished(dep, dep.submit(cfg2), cfg2)
    cfg3 = cfg_of(tmp_path / "flower", "scaffold", *SCAFFOLD, "rounds=3")
    with LocalDeployment(3, tmp_path / "dep2", state_dir=state) as dep:
        run = finished(dep, dep.submit(cfg3, resume=True), cfg3)
    assert [r["round"] for r in rows(run)] == [1, 2, 3]
    assert_same_run(run, simulator_run(tmp_path, "scaffold", *SCAFFOLD, "rounds=3"))
