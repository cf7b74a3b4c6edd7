"""Secure aggregation (SecAgg+) on Flower: config checks, Flower's real mod and workflow on an
in-process grid, and a REAL loopback deployment (flower-superlink + three flower-supernode on
127.0.0.1). Two properties are checked on numbers:

- the server never receives an individual update: every array, number list and byte string of
  every message the ServerApp received (recorded by mmfl.flower.tap) is compared with each
  client's true update (full model and w_k - w^t, replayed in process from the same seeds):
  none is equal or correlated beyond chance (|Pearson r| sqrt(n) < 5); the same detector finds
  the updates in a plain run's messages (equal), so it can see them;
- each round's global model equals the plain weighted mean of the same client updates within
  SecAgg+'s quantization bound (:func:`quantization_bound`).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import patience  # noqa: E402
import torch

import mmfl

pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

from flwr.common import bytes_to_ndarray  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from mmfl.cli import main as cli_main  # noqa: E402
from mmfl.config import load_config  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402
from mmfl.errors import ConfigError, MMFLError  # noqa: E402
from mmfl.flower.deploy import LocalDeployment  # noqa: E402
from mmfl.flower.secagg import SecureAggregation  # noqa: E402
from mmfl.flower.tap import ENV, RecordingGrid, load  # noqa: E402
from mmfl.flower.transport import FlowerTransport  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_flower import BASE, InProcessGrid, rows  # noqa: E402

SECAGG = ['secure_aggregation.protocol="secaggplus"']


def cfg_of(tmp_path, name, *over, base=BASE):
    return load_config(None, [*base, f"output_dir={tmp_path}", f"name={name}", "keep_checkpoints=2", *over])


def plain(cfg):
    """The same config without [secure_aggregation] (the simulator's plain aggregation)."""
    from mmfl.config import resolve

    raw = cfg.to_dict()
    raw.pop("secure_aggregation", None)
    return resolve(raw)


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize("over, field", [
    (['secure_aggregation.protocol="secagg"'], "secure_aggregation.protocol"),
    (["secure_aggregation.num_shares=2"], "secure_aggregation.num_shares"),
    (["secure_aggregation.num_shares=1.5"], "secure_aggregation.num_shares"),
    (["secure_aggregation.num_shares=5", "secure_aggregation.reconstruction_threshold=5"],
     "secure_aggregation.reconstruction_threshold"),
    (["secure_aggregation.reconstruction_threshold=0.0"], "secure_aggregation.reconstruction_threshold"),
    (["secure_aggregation.clipping_range=0"], "secure_aggregation.clipping_range"),
    (["secure_aggregation.modulus_range=3000000000"], "secure_aggregation.modulus_range"),
    (["secure_aggregation.modulus_range=4194304"], "secure_aggregation.modulus_range"),
    (["secure_aggregation.quantization_range=2000000000"], "secure_aggregation.quantization_range"),
    (["secure_aggregation.max_weight=-1"], "secure_aggregation.max_weight"),
    (["secure_aggregation.mask=1"], "secure_aggregation.mask"),
])
def test_secure_aggregation_config_errors_name_the_field(over, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        load_config(None, [*BASE, *SECAGG, *over])


@pytest.mark.parametrize("over, why", [
    (["algorithm.name=scaffold"], "algorithm 'scaffold' needs more from its clients than the weighted sum"),
    (["algorithm.name=fedfomo"], "algorithm 'fedfomo' needs more"),
    (["algorithm.name=feddyn"], "algorithm 'feddyn' needs more"),
    (['algorithm.aggregation="krum"', "algorithm.aggregation_params={f = 0}"], "'krum' combines individual updates"),
    (['algorithm.aggregation="mean"'], "'mean' combines individual updates"),
    (['dp.mode="central"'], r"\[dp\] clips each client's update on the server"),
    (["clients_per_round=1"], "a round has 1 client"),
])
def test_secure_aggregation_refuses_what_needs_individual_replies(over, why):
    with pytest.raises(ConfigError, match=f"^secure_aggregation: .*{why}"):
        load_config(None, [*BASE, *SECAGG, *over])


@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "fedavgm", "moon"])
def test_secure_aggregation_accepts_the_weight_averaging_algorithms(algo):
    cfg = load_config(None, [*BASE, *SECAGG, f"algorithm.name={algo}", "secure_aggregation.num_shares=3",
                             "secure_aggregation.reconstruction_threshold=2"])
    sa = cfg.secure_aggregation
    assert (sa.num_shares, sa.reconstruction_threshold, sa.quantization_range) == (3, 2, 2 ** 22)
    assert load_config(None, [*BASE, *SECAGG]).secure_aggregation.num_shares == 1.0  # a fraction: all nodes
    assert "[secure_aggregation]" in cfg.to_toml()


def test_mmfl_run_refuses_secure_aggregation_in_one_line(tmp_path, capsys):
    cfg = Path(__file__).with_name("flower_tiny.toml")
    code = cli_main(["run", str(cfg), "--set", SECAGG[0], "--set", f"output_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("mmfl: error: secure_aggregation: SecAgg+ runs on Flower")


# ----------------------------------------------------------------------------- the checks

def quantization_bound(weights: list[float], deltas: list[np.ndarray], sa, max_weight: float) -> float:
    """Largest error per entry of SecAgg+'s weighted mean against the exact one.

    Node k sends v_k = dq_k d_k with d_k its update and dq_k = round(n_k / W * Q) / Q (W =
    max_weight, Q = quantization_range); each entry is quantized by stochastic rounding to the
    grid of step 2c / Q (c = clipping_range), an error below one step, so the unmasked sum is
    within N 2c / Q of sum_k v_k (N nodes); divided by sum_k dq_k. The weights' own rounding
    (|dq_k - n_k / W| <= 1 / (2Q)) moves the mean by at most sum_k 1/(2Q) |d_k - M| / sum_k dq_k."""
    q, c, n = sa.quantization_range, sa.clipping_range, len(weights)
    dq = [round(w / max_weight * q) / q for w in weights]
    mean = sum(w * d for w, d in zip(weights, deltas)) / sum(weights)
    spread = max(float(np.abs(d - mean).max()) for d in deltas)
    return (n * 2 * c / q + n * spread / (2 * q)) / sum(dq)


def replay_round(cfg, rnd: int, global_state: dict[str, torch.Tensor]):
    """The clients' true replies of round ``rnd`` from ``global_state`` (the simulator, same seeds),
    the messages sent, and the plain FedAvg aggregate."""
    exp = Experiment(plain(cfg), progress=False)
    exp.server.model.load_state_dict(global_state)
    exp.transport.begin_round(rnd)
    cohort = list(range(exp.federation.num_clients))
    msgs = exp.server.configure_train(rnd, cohort)
    replies = exp.transport.send("train", msgs)
    return msgs, replies, exp.server.aggregate(rnd, replies)


def server_model(run_dir: Path, rnd: int) -> dict[str, torch.Tensor]:
    state = load_file(str(run_dir / "checkpoints" / f"round_{rnd:05d}" / "server.safetensors"))
    return {k.removeprefix("model/"): v for k, v in state.items() if k.startswith("model/")}


def numeric_arrays(value) -> list[np.ndarray]:
    """Every numeric array a received record value holds: arrays, number lists, and byte strings
    read as numpy's serialization where they are one, else as bytes."""
    if isinstance(value, np.ndarray):
        return [value.astype(np.float64).ravel()] if value.dtype.kind in "fiub" else []
    if isinstance(value, (bytes, bytearray)):
        try:
            return [np.asarray(bytes_to_ndarray(bytes(value)), dtype=np.float64).ravel()]
        except Exception:  # noqa: BLE001 - not numpy's format: keys, ciphertexts, shares
            return [np.frombuffer(bytes(value), dtype=np.uint8).astype(np.float64)]
    if isinstance(value, list):
        out = []
        if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            out.append(np.asarray(value, dtype=np.float64))
        for v in value:
            if isinstance(v, (bytes, bytearray, np.ndarray)):
                out += numeric_arrays(v)
        return out
    return []


def received_arrays(messages: list[dict]) -> list[np.ndarray]:
    return [a for m in messages for rec in m["records"].values() for v in rec.values() for a in numeric_arrays(v)]


def individual_updates(msgs, replies) -> list[np.ndarray]:
    """Each client's sent tensors and its update w_k - w^t, flattened (tensors of >= 2 entries)."""
    out = []
    for cid, r in replies.items():
        for k, t in r.arrays.items():
            if t.numel() >= 2:
                out.append(t.double().numpy().ravel())
                out.append((t.double() - msgs[cid].arrays[k].double()).numpy().ravel())
    return out


def leak(received: list[np.ndarray], updates: list[np.ndarray]) -> float:
    """How much of an individual update the received arrays show: inf if one equals an update
    (to 1e-6), else the largest |Pearson r| * sqrt(n) between a received array and an update of
    the same length n >= 100 (a z-score: about N(0, 1) for arrays independent of the update, so
    below 5 but for a 1e-6 chance per pair; a linear image of an update gives sqrt(n) >= 10)."""
    worst = 0.0
    by_len: dict[int, list[np.ndarray]] = {}
    for u in updates:
        by_len.setdefault(u.size, []).append(u)
    for a in received:
        for u in by_len.get(a.size, []):
            if np.allclose(a, u, rtol=1e-6, atol=1e-6):
                return math.inf
            if a.size >= 100 and a.std() > 0 and u.std() > 0:
                worst = max(worst, abs(float(np.corrcoef(a, u)[0, 1])) * math.sqrt(a.size))
    return worst


def check_rounds(cfg, run_dir: Path, received: list[dict], rounds: int = 2,
                 nodes: list[list[int]] | None = None) -> list[tuple[float, float]]:
    """Per round: no individual update among the received messages, and the global model within
    the quantization bound of the plain weighted mean; (max error, bound) per round. ``nodes``:
    the clients of each SuperNode (default: one each), which sends their weighted mean."""
    sa = cfg.secure_aggregation
    start = Experiment(plain(cfg), progress=False).server.model.state_dict()
    got = []
    for rnd in range(rounds):
        msgs, replies, exact = replay_round(cfg, rnd, start if rnd == 0 else server_model(run_dir, rnd))
        assert leak(received_arrays(received), individual_updates(msgs, replies)) < 5
        n = {c: float(r.scalars["num_examples"]) for c, r in replies.items()}
        groups = nodes or [[c] for c in sorted(replies)]
        weights = [sum(n[c] for c in g) for g in groups]
        secure = server_model(run_dir, rnd + 1)
        err, bound = 0.0, 0.0
        for k in exact:
            d = {c: (r.arrays[k].double() - msgs[c].arrays[k].double()).numpy() for c, r in replies.items()}
            deltas = [sum(n[c] * d[c] for c in g) / w for g, w in zip(groups, weights)]
            b = quantization_bound(weights, deltas, sa, max(weights)) + 2 * 2.0 ** -24 * float(exact[k].abs().max())
            e = float((secure[k].double() - exact[k].double()).abs().max())
            assert e <= b, (rnd, k, e, b)
            err, bound = max(err, e), max(bound, b)
        got.append((err, bound))
    return got


# ----------------------------------------------------------------------------- in-process grid

def grid_run(tmp_path, name, node_configs, *over, base=BASE, resume=False):
    """A SecAgg+ run on a fresh in-process grid (Flower's real mod and workflow); its config and
    every message the server received."""
    cfg = cfg_of(tmp_path / "grid", name, *SECAGG, *over, base=base)
    grid = RecordingGrid(InProcessGrid(cfg.to_toml(), node_configs), tmp_path / "tap" / name)

    def transport(e):
        t = FlowerTransport(grid, e.federation, cfg.run, wait_for_nodes_s=0, state_file=cfg.run_dir / "flower_state.json")
        t.secure = SecureAggregation(cfg.secure_aggregation, e.federation)
        return t

    Experiment(cfg, progress=False, transport=transport).run(resume=resume)
    return cfg, load(tmp_path / "tap" / name)


THREE = {10 + k: {"partition-id": k, "num-partitions": 3} for k in range(3)}


@pytest.mark.flwr_range
def test_secagg_in_process_hides_updates_and_equals_plain_mean_within_bound(tmp_path):
    cfg, received = grid_run(tmp_path, "fedavg", THREE)
    for (err, bound) in check_rounds(cfg, cfg.run_dir, received):
        assert 0 < err <= bound < 1e-4  # quantized (not exact), within the bound
    # what the server got from the clients in round 1: masked vectors, keys, shares, scalars; no arrays
    train = [m for m in received if m["message_type"] == "train"]
    assert len(train) == 2 * 4 * 3  # 2 rounds x 4 stages x 3 nodes
    assert all(rec == {} for m in train for name, rec in m["records"].items()
               if name.endswith((".arrays", ".parameters")))  # the mod cleared every array record
    row = rows(cfg.run_dir)[0]
    model_bytes = 4 * (16 * 649 + 16 + 10 * 16 + 10)
    assert row["bytes_by_route"]["train"] == {"down": 3 * model_bytes, "up": 3 * 3 * 8}  # scalars only
    assert row["bytes_by_route"]["secagg"]["up"] > 3 * 2 * model_bytes  # int64 masked vectors + keys + shares


def test_the_leak_detector_sees_plain_updates(tmp_path):
    # the same detector on a plain run's received messages finds the updates (equal arrays)
    cfg = cfg_of(tmp_path / "grid", "plain")
    grid = RecordingGrid(InProcessGrid(cfg.to_toml(), THREE), tmp_path / "tap")
    Experiment(cfg, progress=False, transport=lambda e: FlowerTransport(grid, e.federation, cfg.run,
                                                                       wait_for_nodes_s=0)).run()
    start = Experiment(cfg, progress=False).server.model.state_dict()
    msgs, replies, _ = replay_round(cfg, 0, start)
    assert leak(received_arrays(load(tmp_path / "tap")), individual_updates(msgs, replies)) == math.inf


def test_secagg_with_two_clients_on_one_node(tmp_path):
    # node 0 hosts clients 0 and 2: it sends their weighted mean as one vector (2 nodes, 3 clients)
    nodes = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}
    cfg, received = grid_run(tmp_path, "two", nodes, "rounds=1", "secure_aggregation.num_shares=3",
                             "secure_aggregation.reconstruction_threshold=2")
    ((err, bound),) = check_rounds(cfg, cfg.run_dir, received, rounds=1, nodes=[[0, 2], [1]])
    assert err <= bound
    assert rows(cfg.run_dir)[0]["clients_replied"] == 3


def test_secagg_refuses_an_update_it_would_clip(tmp_path):
    with pytest.raises(MMFLError, match="exceeds clipping_range = 1e-06.*raise secure_aggregation.clipping_range"):
        grid_run(tmp_path, "clip", THREE, "rounds=1", "secure_aggregation.clipping_range=1e-6")


def test_secagg_moon_resumes_with_its_client_state(tmp_path):
    # MOON keeps each client's previous model on its node (state-dir): the collect stage's reply
    # still tells the server which clients kept state, so a resume finds it, or refuses without it
    def nodes(state):
        return {10 + k: {"partition-id": k, "num-partitions": 3, "state-dir": str(state)} for k in range(3)}

    grid_run(tmp_path, "moon", nodes(tmp_path / "state"), "algorithm.name=moon")
    with pytest.raises(MMFLError, match="kept state before round 3"):
        grid_run(tmp_path, "moon", nodes(tmp_path / "empty"), "algorithm.name=moon", "rounds=3", resume=True)
    cfg, _ = grid_run(tmp_path, "moon", nodes(tmp_path / "state"), "algorithm.name=moon", "rounds=3", resume=True)
    assert [r["round"] for r in rows(cfg.run_dir)] == [1, 2, 3]
    assert rows(cfg.run_dir)[-1]["accuracy"] > 0.9


MFEDAVG = ["data.name=mfeat", 'data.views=["pix", "fou"]', "partition.num_clients=3", "model.name=multimodal",
           "model.feat_dim=8", "model.mlp_hidden=[16]", "algorithm.name=mfedavg", "train.local_epochs=1",
           "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1", "rounds=1"]


def test_secagg_multimodal_weight_averaging_needs_every_module_everywhere(tmp_path):
    cfg, received = grid_run(tmp_path, "mfedavg", THREE, base=MFEDAVG)
    ((err, bound),) = check_rounds(cfg, cfg.run_dir, received, rounds=1)
    assert err <= bound
    with pytest.raises(MMFLError, match="every client must hold every module"):
        grid_run(tmp_path, "unimodal", THREE, 'modalities.name="explicit"',
                 'modalities.holds=[["pix", "fou"], ["pix"], ["pix", "fou"]]', base=MFEDAVG)


# ----------------------------------------------------------------------------- real processes

@pytest.mark.flwr_range
@pytest.mark.slow
def test_loopback_secagg_server_never_sees_an_update(tmp_path):
    """flower-superlink + 3 flower-supernode on 127.0.0.1; the ServerApp (a flwr-serverapp process
    the SuperLink starts) records every message it receives (MMFL_FLOWER_TAP)."""
    cfg = cfg_of(tmp_path / "flower", "secagg", *SECAGG)
    dep = LocalDeployment(3, tmp_path / "dep")
    dep.env[ENV] = str(tmp_path / "tap")
    # the processes import the mmfl this test imports (an editable install may point at another checkout)
    dep.env["PYTHONPATH"] = os.pathsep.join([str(Path(mmfl.__file__).resolve().parents[1]),
                                             *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        dep.start()
        run_id = dep.submit(cfg)
        status = dep.wait(run_id, timeout=patience(300), done_file=cfg.run_dir / "summary.json")
        assert status == "finished:completed", dep.run_log(run_id)[-3000:] + dep.log("superlink")[-2000:]
    finally:
        dep.stop()
    received = load(tmp_path / "tap")
    assert sum(m["message_type"] == "train" for m in received) == 2 * 4 * 3
    results = check_rounds(cfg, cfg.run_dir, received)
    for err, bound in results:
        assert 0 < err <= bound
    # against the plain run of the simulator (which Flower's plain runs equal bit for bit)
    sim = plain(cfg_of(tmp_path / "sim", "plain"))
    Experiment(sim, progress=False).run()
    final = max(float((server_model(cfg.run_dir, 2)[k].double() - v.double()).abs().max())
                for k, v in server_model(sim.run_dir, 2).items())
    acc = [r["accuracy"] for r in rows(cfg.run_dir)], [r["accuracy"] for r in rows(sim.run_dir)]
    print(f"\nsecagg loopback: per round (max error, bound) {results}; final vs plain {final:.3g}; "
          f"accuracy {acc}; bytes round 1 {rows(cfg.run_dir)[0]['bytes_by_route']}; "
          f"train_time_s {[round(r['train_time_s'], 1) for r in rows(cfg.run_dir)]} "
          f"(plain simulator {[round(r['train_time_s'], 2) for r in rows(sim.run_dir)]})")
    assert final < 1e-4
    assert os.path.isdir(tmp_path / "tap")
