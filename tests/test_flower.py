"""mmfl on Flower: record round trips, the transport against an in-process grid,
and REAL Flower processes on 127.0.0.1 (a SuperLink and three SuperNodes, free
ports, always stopped) plus the Ray simulation engine; each run must end with
the same global model as the in-process simulator for the same seed."""

from __future__ import annotations

import json
import signal
import time
import uuid
from types import SimpleNamespace
from pathlib import Path

import pytest
from conftest import patience, wait_for  # noqa: E402
import torch

flwr = pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

from flwr.app import Context, Message as FlowerMessage, RecordDict  # noqa: E402
from flwr.app import Error  # noqa: E402
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from mmfl.cli import main as cli_main  # noqa: E402
from mmfl.config import load_config  # noqa: E402
from mmfl.core.message import Message  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402
from mmfl.data.federation import build_federation  # noqa: E402
from mmfl.errors import MMFLError  # noqa: E402
from mmfl.flower.client_app import CONFIG_KEY, handle  # noqa: E402
from mmfl.flower.deploy import LocalDeployment  # noqa: E402
from mmfl.flower.records import decode, encode  # noqa: E402
from mmfl.flower.transport import FlowerTransport  # noqa: E402

try:
    from data_fixtures import write_manifest
except ImportError:  # run as the package tests.*
    from tests.data_fixtures import write_manifest

# mfeat: six feature views per digit (multimodal), no download; 3 clients, tiny MLP.
BASE = ["data.name=mfeat", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1", "rounds=2"]


# FedCMI's case D on two mfeat views: Dirichlet(5) labels, 2 of the 4 clients unimodal (one
# "pix", one "fou"); their multimodal models have private infiltration projectors.
MULTIMODAL = ["data.name=mfeat", 'data.views=["pix", "fou"]', "partition.num_clients=4", 'case="D"',
              "model.name=multimodal", "model.feat_dim=8", "model.mlp_hidden=[16]", "model.two_projector=true",
              "algorithm.name=fedcmi", "train.local_epochs=1", "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05",
              "threads=1", "rounds=2"]


def cfg_of(tmp_path, name, *over, base=BASE):
    return load_config(None, [*base, f"output_dir={tmp_path}", f"name={name}", *over])


def simulator_run(tmp_path, name, *over, base=BASE) -> Path:
    cfg = cfg_of(tmp_path / "sim", name, *over, base=base)
    Experiment(cfg, progress=False).run()
    return cfg.run_dir


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def timeless(rs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rs]


def final_server_state(run_dir: Path) -> dict:
    ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "LATEST").read_text().strip()
    return load_file(str(ckpt / "server.safetensors"))


def max_abs_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def assert_same_run(flower_dir: Path, sim_dir: Path) -> None:
    """Same metrics (accuracy, losses, bytes per route and client) and the same final model.
    Both transports run the same client code on the same data with the same seeds,
    one thread, and messages cross Flower bit for bit, so the model is equal exactly."""
    assert timeless(rows(flower_dir)) == timeless(rows(sim_dir))
    assert max_abs_diff(final_server_state(flower_dir), final_server_state(sim_dir)) == 0.0


# ----------------------------------------------------------------------------- records

@pytest.mark.flwr_range
def test_message_records_round_trip_exactly():
    arrays = {"w": torch.randn(3, 4), "i": torch.arange(5), "h": torch.randn(2, dtype=torch.float16),
              "bf": torch.randn(3, dtype=torch.bfloat16), "scalar": torch.tensor(2.5, dtype=torch.float64),
              "mask": torch.tensor([True, False]), "empty": torch.zeros(0, 7), "t": torch.randn(4, 3).t()}
    scalars = {"n": 7, "loss": 0.25, "one": 1.0, "flag": True, "tag": "é"}
    msg = Message(arrays=arrays, scalars=scalars)
    rd = recorddict_from_proto(recorddict_to_proto(encode({4: msg, 9: Message()}, route="train", rnd=3)))
    out, meta = decode(rd)
    assert sorted(out) == [4, 9] and meta["route"] == "train" and meta["rnd"] == 3
    got = out[4]
    for k, t in arrays.items():
        assert got.arrays[k].dtype == t.dtype and got.arrays[k].shape == t.shape and torch.equal(got.arrays[k], t), k
    assert got.scalars == scalars and all(type(got.scalars[k]) is type(v) for k, v in scalars.items())
    assert got.nbytes() == msg.nbytes()  # bookkeeping travels outside the message: same byte count
    assert out[9].arrays == {} and out[9].scalars == {}


# ----------------------------------------------------------------------------- in-process grid

class InProcessGrid(Grid):
    """A Grid whose nodes run the mmfl ClientApp handler in this process; ``dead``
    nodes never answer (a SuperNode that died after it registered); ``unavailable`` nodes
    get the SuperLink's "node unavailable" error reply (one that left after it answered): an
    error written by the SuperLink (``src_node_id`` 1, Flower's SUPERLINK_NODE_ID), code 5
    (Flower's ErrorCode.NODE_UNAVAILABLE), while Flower still lists the node."""

    def __init__(self, config_text: str, node_configs: dict[int, dict], dead=(), unavailable=()):
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # who sends (Flower sets these)
        self.text, self.dead, self.unavailable = config_text, set(dead), set(unavailable)
        self.ctx = {n: Context(run_id=1, node_id=n, node_config=nc, state=RecordDict(),
                               run_config={CONFIG_KEY: config_text}) for n, nc in node_configs.items()}
        self.inbox: dict[str, FlowerMessage] = {}

    def set_run(self, run):
        pass

    @property
    def run(self):
        return SimpleNamespace(run_id=1)  # what Flower's legacy workflows read of a Run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return FlowerMessage(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self):
        return list(self.ctx)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.inbox[m.metadata.message_id] = m
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        out = []
        for mid in list(message_ids):
            m = self.inbox.get(mid)
            if m is None or m.metadata.dst_node_id in self.dead:
                continue
            del self.inbox[mid]
            if m.metadata.dst_node_id in self.unavailable:
                err = FlowerMessage(Error(5, "Error: Node Unavailable"), reply_to=m)
                err.metadata.__dict__["_src_node_id"] = 1  # written by the SuperLink, not the node
                out.append(err)
                continue
            wire = FlowerMessage(recorddict_from_proto(recorddict_to_proto(m.content)), reply_to=m)
            wire.metadata.__dict__.update(m.metadata.__dict__)
            out.append(handle(wire, self.ctx[m.metadata.dst_node_id]))
        return out

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))


def grid_run(tmp_path, name, node_configs, *over, dead=(), unavailable=(), base=BASE) -> Path:
    cfg = cfg_of(tmp_path / "grid", name, *over, base=base)
    grid = InProcessGrid(cfg.to_toml(), node_configs, dead, unavailable)
    Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(grid, e.federation, cfg.run,
                                                                       wait_for_nodes_s=0)).run()
    return cfg.run_dir


@pytest.mark.flwr_range
@pytest.mark.parametrize("algo", ["moon", "local"])
def test_transport_with_state_and_several_clients_per_node_equals_simulator(tmp_path, algo):
    # two nodes host three clients (partition-id k of 2: clients c % 2 == k); MOON keeps its
    # previous model per client in the node's context.state; SOLO ("local") keeps its whole
    # model there and answers a second route, "evaluate", sent to every client
    over = [f"algorithm.name={algo}"]
    nodes = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}
    assert_same_run(grid_run(tmp_path, algo, nodes, *over), simulator_run(tmp_path, algo, *over))


def test_transport_dpsgd_client_accountant_in_node_state_equals_simulator(tmp_path):
    # [dp] mode = "sample": each client's DP-SGD accountant lives in its node's context.state and its
    # epsilon crosses Flower as a reply scalar; the run equals the simulator's (dp/epsilon included)
    over = ["dp.mode=sample", "dp.noise_multiplier=1.0", "rounds=2"]
    nodes = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}
    flower = grid_run(tmp_path, "dpsgd", nodes, *over)
    assert_same_run(flower, simulator_run(tmp_path, "dpsgd", *over))
    assert rows(flower)[-1]["dp/epsilon"] > rows(flower)[0]["dp/epsilon"] > 0


# CreamFL on mfeat_pair: a public share; client 0 holds image + features, client 1 only the
# image, client 2 only the features; representations of the public set cross, not weights.
CREAMFL = ["data.name=mfeat_pair", "data.public_fraction=0.3", "partition.num_clients=3",
           'modalities.name="explicit"', 'modalities.holds=[["image", "features"], ["image"], ["features"]]',
           "model.name=multimodal", "model.feat_dim=16", "model.cnn_channels=[8]", "model.mlp_hidden=[32]",
           "algorithm.name=creamfl", "algorithm.server_batch_size=64", "algorithm.server_lr=0.005", "train.local_epochs=1",
           "train.batch_size=64", "train.optimizer=adam", "train.lr=0.001", "threads=1", "rounds=2"]


def test_transport_creamfl_with_unimodal_clients_equals_simulator(tmp_path):
    nodes = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}
    flower = grid_run(tmp_path, "creamfl", nodes, base=CREAMFL)
    assert_same_run(flower, simulator_run(tmp_path, "creamfl", base=CREAMFL))
    last = rows(flower)[-1]
    assert last["class_r1_sum"] > 40 and "i2t_r10" in last  # by class: well above chance (2 x 10%)


def test_missing_replies_are_dropped_or_fail_as_configured(tmp_path):
    nodes = {10 + k: {"partition-id": k, "num-partitions": 3} for k in range(3)}
    over = ["reply_timeout=0.5", "rounds=1"]
    run = grid_run(tmp_path, "drop", nodes, *over, "on_missing_reply=drop", dead=[12])
    (row,) = rows(run)  # client 2's node never answered its hello: the round runs with clients 0 and 1
    assert row["dropped"] == [2] and row["clients_replied"] == 2 and row["bytes_per_client"]["2"]["up"] == 0
    with pytest.raises(MMFLError, match=r"1 of 3 clients have no SuperNode.*partition-id"):
        grid_run(tmp_path, "fail", nodes, *over, "on_missing_reply=fail", dead=[12])
    # its node answered the hello but left before the pull: the SuperLink's error reply drops it too
    (row,) = rows(grid_run(tmp_path, "gone", nodes, *over, "on_missing_reply=drop", unavailable=[12]))
    assert row["dropped"] == [2] and row["clients_replied"] == 2


def test_a_node_with_a_different_data_slice_is_refused(tmp_path):
    # the node splits with another Dirichlet beta than the server: its clients' data differ
    nodes = {1: {"partition-id": 0, "num-partitions": 1, "partition.beta": 5.0}}
    with pytest.raises(MMFLError, match="client 0 on SuperNode 1 has a different data slice"):
        grid_run(tmp_path, "mismatch", nodes, "partition.num_clients=2", "partition.beta=0.5")


def test_a_node_whose_clients_hold_other_modalities_is_refused(tmp_path):
    # the node's copy of the data (data.root) has the same labels but another second modality:
    # the data slices' fingerprints agree, the modalities its clients hold do not
    for root, other in (("server", "b"), ("node", "c")):
        (tmp_path / root).mkdir()
        write_manifest(tmp_path / root / "manifest.csv",
                       [{"label": i % 2, "a": f"{i} 1", other: f"1 {i}"} for i in range(24)])
    nodes = {1: {"partition-id": 0, "num-partitions": 1, "data.root": str(tmp_path / "node")}}
    with pytest.raises(MMFLError, match="client 0 on SuperNode 1 holds modalities a\\+c, the server expects a\\+b"):
        grid_run(tmp_path, "modalities", nodes, "data.name=manifest", f"data.root={tmp_path / 'server'}",
                 "partition.num_clients=2", "partition.min_size=1")


def test_a_node_cannot_override_the_modality_assignment(tmp_path):
    nodes = {1: {"partition-id": 0, "num-partitions": 1, "modalities.name": "explicit"}}
    with pytest.raises(MMFLError, match=r"node config modalities.name: .*\[modalities\] table"):
        grid_run(tmp_path, "override", nodes, "partition.num_clients=2")


# ----------------------------------------------------------------------------- real processes

@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """flower-superlink --insecure + 3 flower-supernode on 127.0.0.1; stopped even on failure."""
    dep = LocalDeployment(3, tmp_path_factory.mktemp("flower"))
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()


def finished(dep, run_id: int, cfg) -> Path:
    status = dep.wait(run_id, timeout=patience(300), done_file=cfg.run_dir / "summary.json")
    assert status == "finished:completed", dep.run_log(run_id)[-3000:] + dep.log("superlink")[-2000:]
    return cfg.run_dir


@pytest.fixture(scope="module")
def loopback_runs(deployment, tmp_path_factory):
    """FedAvg, SCAFFOLD and FedCMI submitted together: the SuperLink runs them at once on
    the same SuperNodes (each run has its own context.state on every node)."""
    tmp = tmp_path_factory.mktemp("loopback")
    cfgs = {"fedavg": cfg_of(tmp / "flower", "fedavg"),
            "scaffold": cfg_of(tmp / "flower", "scaffold", "algorithm.name=scaffold"),
            "fedcmi": cfg_of(tmp / "flower", "fedcmi", base=MULTIMODAL)}
    ids = {name: deployment.submit(cfg) for name, cfg in cfgs.items()}
    deployment.run_ids = ids
    return tmp, {name: finished(deployment, ids[name], cfg) for name, cfg in cfgs.items()}


@pytest.mark.slow
def test_loopback_fedavg_equals_simulator(loopback_runs):
    tmp, runs = loopback_runs
    run = runs["fedavg"]
    assert [r["round"] for r in rows(run)] == [1, 2] and all("accuracy" in r for r in rows(run))
    assert (run / "summary.json").is_file()
    assert_same_run(run, simulator_run(tmp, "fedavg"))


@pytest.mark.slow
def test_loopback_scaffold_client_state_equals_simulator(loopback_runs):
    # SCAFFOLD's control variates live in each SuperNode's context.state between rounds
    tmp, runs = loopback_runs
    assert_same_run(runs["scaffold"], simulator_run(tmp, "scaffold", "algorithm.name=scaffold"))


@pytest.mark.slow
def test_loopback_fedcmi_unimodal_clients_equals_simulator(loopback_runs):
    # case D: clients holding one modality build a model with only that modality's modules,
    # and each client's private infiltration projectors (never uploaded) live in its SuperNode's
    # context.state between rounds; SuperNode 0 hosts a multimodal and a unimodal client
    tmp, runs = loopback_runs
    sim = simulator_run(tmp, "fedcmi", base=MULTIMODAL)
    holds = build_federation(cfg_of(tmp, "fedcmi", base=MULTIMODAL)).client_modalities
    assert holds == [("pix", "fou"), ("pix",), ("pix", "fou"), ("fou",)]  # node 0: clients 0 and 3
    last = rows(runs["fedcmi"])[-1]
    assert {"accuracy/pix", "accuracy/fou", "uar", "cmi_rd"} <= set(last)
    assert_same_run(runs["fedcmi"], sim)


@pytest.mark.slow
def test_run_status_through_flwr_ls(deployment, loopback_runs):
    # Flower's public CLI (`flwr ls --run-id N --format json`) reads a finished run; no run, or
    # no SuperLink, is one line with Flower's reason
    from mmfl.flower.deploy import run_status

    assert run_status(deployment.run_ids["fedavg"], "loopback", deployment.home) == "finished:completed"
    with pytest.raises(MMFLError, match="cannot get the status of run 987654321 from SuperLink 'loopback': .*not found"):
        run_status(987654321, "loopback", deployment.home)
    with pytest.raises(MMFLError, match="cannot get the status of run 1 from SuperLink 'nowhere'"):
        run_status(1, "nowhere", deployment.home)


def test_waiting_asks_flower_seldom_and_at_once_when_the_summary_appears(tmp_path, monkeypatch):
    """``wait`` asks the SuperLink (a `flwr ls` process, about a CPU second each) at growing
    intervals, and at once when the run's summary is written; on a fake clock: a run that
    finishes at 300 s is seen within a second of its summary with 26 asks or fewer (a fixed
    2 s poll asks 150 times), and without a summary within max_poll of its end."""
    from mmfl.flower import deploy

    clock = {"t": 0.0}
    monkeypatch.setattr(deploy.time, "monotonic", lambda: clock["t"])
    done = tmp_path / "summary.json"

    def sleep(dt):
        clock["t"] += dt
        if clock["t"] >= 300 and not done.exists():
            done.write_text("{}")

    monkeypatch.setattr(deploy.time, "sleep", sleep)
    for with_file in (True, False):
        clock["t"], asks = 0.0, []
        done.unlink(missing_ok=True)

        def status(run_id, connection, home):
            asks.append(clock["t"])
            return "finished:completed" if clock["t"] >= 300 else "running"

        monkeypatch.setattr(deploy, "run_status", status)
        assert deploy.wait(1, "c", tmp_path, done_file=done if with_file else None) == "finished:completed"
        assert len(asks) <= 300 / 15 + 6 and asks[0] >= 2.0  # growing to every max_poll = 15 s
        assert asks[-1] - 300 <= (1.0 if with_file else 15.0)


@pytest.mark.slow
def test_loopback_killed_supernode_is_dropped(deployment, loopback_runs, tmp_path):
    # after the runs above (it kills a node of the shared deployment): SuperNode 2 (client 2)
    # answers the run's hello, then is killed (SIGTERM: it leaves the federation) before it
    # answers round 1, which completes without it, long before reply_timeout. (A crash, where
    # no reply ever comes and the node does not say goodbye, is the in-process test above.)
    # (reply_timeout bounds the wait for a node when the kill lands before the ServerApp pulled
    # the hello's answer: the SuperLink then answers "node unavailable" and client 2 has no node)
    cfg = cfg_of(tmp_path / "flower", "kill", "rounds=1", "on_missing_reply=drop", "reply_timeout=60")
    seen = len(deployment.log("supernode2"))  # its log of the earlier runs
    run_id = deployment.submit(cfg)

    def answered_hello() -> bool:
        new = deployment.log("supernode2")[seen:]
        hello = new.find("Sending: query.mmfl_hello")
        return hello >= 0 and "Sent successfully" in new[hello:]

    wait_for(answered_hello, 150, "SuperNode 2 answering the run's hello")
    time.sleep(1.0)  # the ServerApp pulls replies every 0.1 s
    deployment.kill("supernode2", signal.SIGTERM)
    (r1,) = rows(finished(deployment, run_id, cfg))
    assert r1["clients_replied"] == 2 and r1["dropped"] == [2] and "accuracy" in r1
    assert r1["bytes_per_client"]["2"]["up"] == 0 and r1["bytes_per_client"]["0"]["up"] > 0
    assert r1["train_time_s"] < cfg.run.reply_timeout / 2


@pytest.mark.flwr_range
@pytest.mark.slow
def test_ray_simulation_equals_simulator(tmp_path, capsys):
    # four clients on two virtual SuperNodes (clients c % 2 == k on node k), via the CLI
    over = ["partition.num_clients=4", "algorithm.name=moon", f"output_dir={tmp_path / 'ray'}", "name=ray"]
    argv = ["flower", "simulate", str(Path(__file__).with_name("flower_tiny.toml")), "--num-supernodes", "2",
            "--ray-cpus", "2"]
    for o in [*BASE, *over]:
        argv += ["--set", o]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert_same_run(tmp_path / "ray" / "ray", simulator_run(tmp_path, "ray", *over[:2]))


@pytest.mark.flwr_range
def test_flower_cli_errors_are_one_line(tmp_path, capsys):
    cfg = Path(__file__).with_name("flower_tiny.toml")
    assert cli_main(["flower", "submit", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: ") and "--superlink" in err[0]


def test_simulate_fractional_cpus_per_client_is_one_line(tmp_path, capsys):
    # Flower's simulation config (flwr run --federation-config) takes whole CPUs per ClientApp
    argv = ["flower", "simulate", str(Path(__file__).with_name("flower_tiny.toml")), "--cpus-per-client", "0.5",
            *[x for o in [*BASE, f"output_dir={tmp_path}"] for x in ("--set", o)]]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: ") and "whole number of CPUs" in err[0]
