"""Missing modalities per sample on Flower: the manifest of ``test_manifest_missing_runs`` (digits,
~30 % of the rows with an empty ``features`` cell, a few ``image`` files that do not exist, in
train, test and public rows) runs with every multimodal algorithm on Flower, and each Flower run's
``metrics.jsonl`` (accuracy by missingness pattern included) and final model equal the in-process
simulator's for the same config and seed.

How the algorithms are grouped, to stay within a few minutes on a 2-core machine:

- **every** algorithm of the registry (the cases of ``test_manifest_missing_runs``, 2 rounds) runs
  through :class:`~mmfl.flower.transport.FlowerTransport` on the in-process grid of
  ``test_flower`` (two nodes, node 0 hosting clients 0 and 2): the real ClientApp handler builds
  its clients' slices (and their ``present/<m>`` masks) from the run config, messages cross as
  Flower records serialized to protobuf and back; about a second per algorithm. It runs twice:
  once in one process that serves both nodes and keeps its models between messages (as Flower's
  Ray simulation engine runs the ClientApp in an actor), and once with each message handled as a
  deployment's SuperNode does, in a fresh ClientApp process (:class:`FreshProcessGrid`): nothing
  the ClientApp built for the last message is left (its model pool, privacy checker, attack; the
  data set, which clients only read, is kept), and a node's ``context.state`` holds only what
  survives Flower's serialization of it. So every algorithm is shown to keep nothing between
  messages outside its declared client state, and that state to cross a process boundary;
- the two ways of personalized evaluation on a **real loopback deployment** (``flower-superlink``
  and three ``flower-supernode`` processes on 127.0.0.1, one client each; a ``flwr-clientapp``
  process per message), submitted together: FedMSplit (stateful: each SuperNode evaluates its
  client's own model on its own rows and sends back its pattern counts) and FedFomo (the server's
  copy of each client's model goes to that client's SuperNode, which scores it). They prove the
  deployment's own path (the ServerApp and ClientApp processes, the node config's data root,
  gRPC), which is the same for every algorithm: what differs between algorithms is the messages
  and the client state, which the fresh-process grid checks for each (until issue 28 MFedAvg,
  FedCMI, CreamFL and PartialFL ran there too, and FedFomo on a deployment of its own in
  ``test_evaluation``);
- split learning on Flower's **Ray simulation engine** (``mmfl flower simulate``, 2 SuperNodes):
  its cut exchanges a message per batch and client, one after another, and a deployment starts a
  ``flwr-clientapp`` process per message and polls every 3 s (a round took 6 minutes on this
  loaded 2-core machine), where Ray's actors stay up. (Until issue 28 pFedWireless ran there too:
  its messages and state are the grid's both ways, its personalized evaluation on real processes
  FedMSplit's and FedFomo's on the deployment, the Ray engine split learning's here and
  ``test_flower``'s.)

Personalized algorithms evaluate on the SuperNodes through ``evaluate_personal`` messages, which
the simulator scores in process: their ``eval_bytes_*`` differ by design (docs/flower.md), every
other number is equal. CreamFL's family reports retrieval (Recall@K, scored on the test rows
holding both modalities), so it has no ``pattern/*`` keys, on Flower as in the simulator; SOLO
(``local``) reports the mean over its clients' models per pattern.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import patience  # noqa: E402

pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

from flwr.common.serde import recorddict_from_proto, recorddict_to_proto  # noqa: E402

from mmfl.algorithms import ALGORITHMS  # noqa: E402
from mmfl.cli import main as cli_main  # noqa: E402
from mmfl.config import resolve  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402
from mmfl.flower import client_app  # noqa: E402
from mmfl.flower.deploy import LocalDeployment  # noqa: E402
from mmfl.flower.transport import FlowerTransport  # noqa: E402
from mmfl.reference import family  # noqa: E402

try:
    from test_flower import InProcessGrid, final_server_state, max_abs_diff, rows
    from test_manifest_missing_runs import CASES, digits_manifest
except ImportError:  # tests/ imported as a package
    from tests.test_flower import InProcessGrid, final_server_state, max_abs_diff, rows
    from tests.test_manifest_missing_runs import CASES, digits_manifest

# retrieval (from the server's declared evaluations, mmfl.reference.family): no joint accuracy on the shared test set
NO_PATTERNS = {n for n in CASES if family(ALGORITHMS.get(n).factory) == "retrieval"}
LOOPBACK = ["fedmsplit", "fedfomo"]  # the deployment's path; every algorithm's messages and state: FreshProcessGrid
RAY = ["split_learning"]  # pFedWireless: see the docstring


@pytest.fixture(scope="module")
def manifest_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits_missing_flower")
    digits_manifest(root)
    return root


def config_of(case: str, manifest_root: Path, out: Path):
    raw = CASES[case](out)
    raw["data"]["root"] = str(manifest_root)
    raw["name"] = case
    return resolve(raw)


_SIM: dict = {}


def simulator_run(case: str, manifest_root: Path, tmp: Path) -> tuple[Path, bool]:
    """The in-process simulator's run of ``case`` (once per module); and whether its
    evaluations include the personalized kind (clients evaluate through messages on Flower)."""
    if case not in _SIM:
        exp = Experiment(config_of(case, manifest_root, tmp / "sim"), progress=False)
        exp.run()
        _SIM[case] = exp.run_dir, "personalized" in exp.evaluations()
    return _SIM[case]


def assert_same_as_simulator(flower_dir: Path, case: str, manifest_root: Path, tmp: Path) -> list[dict]:
    sim_dir, personal = simulator_run(case, manifest_root, tmp)
    drop = ("_time_s", "eval_bytes_down", "eval_bytes_up") if personal else ("_time_s",)
    strip = lambda rs: [{k: v for k, v in r.items() if not k.endswith(drop)} for r in rs]  # noqa: E731
    got = rows(flower_dir)
    assert strip(got) == strip(rows(sim_dir)), case
    assert max_abs_diff(final_server_state(flower_dir), final_server_state(sim_dir)) == 0.0, case
    return got


def assert_patterns(case: str, got: list[dict]) -> None:
    assert [r["round"] for r in got] == [1, 2]
    for r in got:
        for k, v in r.items():
            if isinstance(v, float) and not k.endswith("_time_s"):
                assert math.isfinite(v), (case, k, v)
    last = got[-1]
    pat = {k: v for k, v in last.items() if k.startswith("pattern/")}
    if case in NO_PATTERNS:
        assert not pat, (case, sorted(pat))
        return
    # the test rows lack features (18 of 60) or the image (6); PartialFL's clients all hold the image
    names = {k.split("/")[1] for k in pat}
    assert {"complete", "no_image"} <= names and (case.startswith(("partialfl", "pfl_")) or "no_features" in names), \
        (case, sorted(pat))
    for name in names:
        assert 0.0 <= pat[f"pattern/{name}/accuracy"] <= 1.0 and pat[f"pattern/{name}/n"] > 0


class FreshProcessGrid(InProcessGrid):
    """The in-process grid with each message handled as in a new ClientApp process (as a deployed
    SuperNode runs it): before each message the ClientApp's per-process run environment is built
    again (its model pool, privacy checker and attack; the data set, which clients only read, is
    kept), and each node's ``context.state`` goes through a protobuf round trip (the SuperNode
    keeps it serialized between ClientApp processes)."""

    def pull_messages(self, message_ids):
        out = []
        for mid in list(message_ids):
            for key, env in list(client_app._RUNS.items()):
                client_app._RUNS[key] = client_app.RunEnv(env.cfg, env.spec, env.federation, env.make_model,
                                                          device=env.device)
            for ctx in self.ctx.values():
                ctx.state = recorddict_from_proto(recorddict_to_proto(ctx.state))
            out += super().pull_messages([mid])
        return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_algorithm_on_the_flower_transport_equals_simulator(case, manifest_root, tmp_path_factory):
    """One process serves both nodes and keeps its models between messages (as a Ray actor does)."""
    grid_equals_simulator(InProcessGrid, "grid", case, manifest_root, tmp_path_factory)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_algorithm_in_a_fresh_clientapp_process_per_message_equals_simulator(case, manifest_root,
                                                                                   tmp_path_factory):
    """Each message in a new ClientApp process, its node's state serialized between (a deployment)."""
    grid_equals_simulator(FreshProcessGrid, "fresh", case, manifest_root, tmp_path_factory)


def grid_equals_simulator(grid_cls, folder: str, case: str, manifest_root: Path, tmp_path_factory) -> None:
    tmp = tmp_path_factory.getbasetemp() / "flower_missing"
    cfg = config_of(case, manifest_root, tmp / folder)
    grid = grid_cls(cfg.to_toml(), {11: {"partition-id": 0, "num-partitions": 2},
                                    22: {"partition-id": 1, "num-partitions": 2}})
    exp = Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(grid, e.federation, cfg.run,
                                                                             wait_for_nodes_s=0))
    exp.run()
    got = assert_same_as_simulator(cfg.run_dir, case, manifest_root, tmp)
    assert_patterns(case, got)


@pytest.fixture(scope="module")
def loopback_runs(manifest_root, tmp_path_factory):
    """The LOOPBACK algorithms submitted together to a SuperLink with three SuperNodes."""
    tmp = tmp_path_factory.getbasetemp() / "flower_missing"
    dep = LocalDeployment(3, tmp_path_factory.mktemp("flower_missing_dep"))
    try:
        dep.start()
        cfgs = {c: config_of(c, manifest_root, tmp / "loopback") for c in LOOPBACK}
        ids = {c: dep.submit(cfg) for c, cfg in cfgs.items()}
        for c, cfg in cfgs.items():
            status = dep.wait(ids[c], timeout=patience(900), done_file=cfg.run_dir / "summary.json")
            assert status == "finished:completed", dep.run_log(ids[c])[-3000:] + dep.log("superlink")[-2000:]
        yield tmp, {c: cfg.run_dir for c, cfg in cfgs.items()}
    finally:
        dep.stop()


@pytest.mark.slow
@pytest.mark.parametrize("case", LOOPBACK)
def test_loopback_deployment_equals_simulator(case, loopback_runs, manifest_root):
    tmp, runs = loopback_runs
    got = assert_same_as_simulator(runs[case], case, manifest_root, tmp)
    assert_patterns(case, got)
    if simulator_run(case, manifest_root, tmp)[1]:  # personalized: the SuperNodes evaluated (models down, metrics up)
        assert all(r["eval_bytes_down"] > 0 and r["eval_bytes_up"] > 0 for r in got), case


@pytest.mark.slow
def test_report_shows_the_pattern_columns_of_a_flower_run(loopback_runs, capsys):
    _, runs = loopback_runs
    run = runs["fedmsplit"]  # personalized: the patterns pooled from the SuperNodes' replies
    assert cli_main(["report", str(run), "--plot", str(run / "acc.png")]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| run"))
    assert "acc complete" in header and "acc no_features" in header and "acc no_image" in header
    last = rows(run)[-1]
    row = next(line for line in out.splitlines() if line.startswith("| fedmsplit"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    for name in ("complete", "no_features", "no_image"):
        assert cells[f"acc {name}"] == f"{100 * last[f'pattern/{name}/accuracy']:.2f}%"


@pytest.mark.slow
@pytest.mark.parametrize("case", RAY)
def test_ray_simulation_equals_simulator(case, manifest_root, tmp_path, capsys):
    cfg = config_of(case, manifest_root, tmp_path / "ray")
    path = tmp_path / "ray.toml"
    path.write_text(cfg.to_toml())
    assert cli_main(["flower", "simulate", str(path), "--num-supernodes", "2", "--ray-cpus", "2"]) == 0, \
        capsys.readouterr().err
    got = assert_same_as_simulator(cfg.run_dir, case, manifest_root, tmp_path)
    assert_patterns(case, got)


def test_a_node_whose_copy_lacks_other_cells_is_named_in_one_warning(manifest_root, tmp_path, caplog):
    """The hello carries how many rows of each client hold each modality: a SuperNode whose copy of
    the manifest lacks one more image file (same rows and labels, so the same slice) trains on its
    own masks, and the server says so in one warning line per client that differs."""
    import logging
    import shutil

    node_root = tmp_path / "node_copy"
    shutil.copytree(manifest_root, node_root)
    import csv

    with open(manifest_root / "manifest.csv") as f:  # a train row that keeps its features: it stays a row
        name = next(r["image"] for r in csv.DictReader(f) if r["split"] == "train" and r["features"]
                    and (manifest_root / r["image"]).is_file())
    (node_root / name).unlink()
    cfg = config_of("mfedavg", manifest_root, tmp_path / "out")
    grid = InProcessGrid(cfg.to_toml(), {1: {"partition-id": 0, "num-partitions": 1, "data.root": str(node_root)}})
    with caplog.at_level(logging.WARNING, logger="mmfl.flower"):
        Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(grid, e.federation, cfg.run,
                                                                           wait_for_nodes_s=0)).run()
    warned = [r.getMessage() for r in caplog.records if "rows holding each modality" in r.getMessage()]
    assert len(warned) == 1 and "on SuperNode 1" in warned[0] and "trains on its own" in warned[0], warned
    node, server = re.search(r"image:(\d+).*image:(\d+)", warned[0]).groups()
    assert int(node) == int(server) - 1  # the node's copy holds one image fewer
    assert [r["round"] for r in rows(cfg.run_dir)] == [1, 2]


def test_secure_aggregation_refuses_per_module_weights_from_missing_cells(manifest_root, tmp_path):
    """SecAgg+ sums one weighted vector per SuperNode; MFedAvg's clients weigh each module by the
    rows that hold its modality, which differ here: the run stops with one line."""
    from mmfl.errors import MMFLError
    from mmfl.flower.secagg import SecureAggregation

    raw = CASES["mfedavg"](tmp_path)
    raw.update(name="secagg", rounds=1, secure_aggregation={"protocol": "secaggplus"})
    raw["data"]["root"] = str(manifest_root)
    cfg = resolve(raw)
    grid = InProcessGrid(cfg.to_toml(), {10 + k: {"partition-id": k, "num-partitions": 3} for k in range(3)})

    def transport(e):
        t = FlowerTransport(grid, e.federation, cfg.run, wait_for_nodes_s=0)
        t.secure = SecureAggregation(cfg.secure_aggregation, e.federation)
        return t

    with pytest.raises(MMFLError, match="weighs modules by their own data sizes .samples missing a modality.") as e:
        Experiment(cfg, progress=False, transport=transport).run()
    assert "\n" not in str(e.value)
