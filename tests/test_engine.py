"""Engine: exact byte accounting, resume equality, untrusted half-written rounds,
determinism, cohort sampling, non-finite replies, checkpoint retention and the
client state store."""

from __future__ import annotations

import json

import pytest
import torch

import mmfl.algorithms as algorithms
from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgServer
from mmfl.engine import checkpoint
from mmfl.core.message import Message, scalar_bytes, tensor_bytes
from mmfl.engine.runner import sample_cohort
from mmfl.engine.state_store import ClientStateStore
from mmfl.errors import ConfigError, MMFLError

from helpers import config as make_cfg, rows as read_rows, run as run_exp, experiment, timeless


# ----------------------------------------------------------------------------- bytes

def test_message_nbytes_on_hand_tensors():
    arrays = {"a": torch.zeros(2, 3, dtype=torch.float32), "b": torch.zeros(4, dtype=torch.int64)}
    assert tensor_bytes(arrays) == 24 + 32
    assert scalar_bytes({"s": "abc"}) == 3
    assert scalar_bytes({"f": 1.5}) == 8
    assert scalar_bytes({"i": 7, "t": True, "u": "é"}) == 8 + 8 + 2  # UTF-8 length of a str
    msg = Message(arrays=arrays, scalars={"s": "abc", "f": 1.5})
    assert msg.nbytes() == 24 + 32 + 3 + 8
    assert Message().nbytes() == 0
    assert Message(arrays={"h": torch.zeros(5, dtype=torch.float16)}).nbytes() == 10


def test_message_nonfinite_key():
    assert Message(arrays={"a": torch.ones(2)}, scalars={"x": 1.0}).nonfinite_key() is None
    assert Message(arrays={"a": torch.ones(2), "b": torch.tensor([1.0, float("nan")])}).nonfinite_key() == "b"
    assert Message(scalars={"loss": float("inf")}).nonfinite_key() == "loss"
    assert Message(arrays={"n": torch.tensor([3])}).nonfinite_key() is None  # integer tensors are finite


def test_fedavg_byte_counts_equal_tensor_sizes(tmp_path):
    exp = run_exp(tmp_path, "bytes", rounds=2)
    sd = exp.make_model().state_dict()
    model_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    # the 16-unit MLP on digits (64 inputs, 10 classes): (64*16 + 16 + 16*10 + 10) float32s
    assert model_bytes == 4 * (64 * 16 + 16 + 16 * 10 + 10)
    rows = read_rows(exp.run_dir)
    assert len(rows) == 2
    for row in rows:
        assert set(row["bytes_per_client"]) == {"0", "1", "2"}
        for c in row["bytes_per_client"].values():
            assert c["down"] == model_bytes
            assert c["up"] == model_bytes + 8 * 3  # num_examples, train_loss, steps
        assert row["bytes_down"] == 3 * model_bytes
        assert row["bytes_up"] == 3 * (model_bytes + 24)
        assert row["bytes_by_route"] == {"train": {"down": 3 * model_bytes, "up": 3 * (model_bytes + 24)}}
        assert "eval_bytes_down" not in row  # FedAvg evaluates on the server
    summary = json.loads((exp.run_dir / "summary.json").read_text())
    assert summary["bytes_down"] == 2 * 3 * model_bytes


# ----------------------------------------------------------------------------- resume

@pytest.mark.parametrize("algo", ["fedavg", "scaffold", "moon"])
def test_resume_equals_uninterrupted_run(tmp_path, algo):
    # 4 clients, 3 per round: cohorts change between rounds, so client state (MOON's
    # previous model, SCAFFOLD's c_i) from rounds before the interruption matters.
    over = [f"algorithm.name={algo}", "partition.num_clients=4", "clients_per_round=3"]
    full = run_exp(tmp_path, "full", *over, rounds=4)
    run_exp(tmp_path, "split", *over, rounds=2)
    resumed = run_exp(tmp_path, "split", *over, rounds=4, resume=True)
    a, b = read_rows(full.run_dir), read_rows(resumed.run_dir)
    assert [r["round"] for r in b] == [1, 2, 3, 4]
    assert timeless(a) == timeless(b)
    for k, v in full.server.state_dict().items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k
    assert full.store.state_dict().keys() == resumed.store.state_dict().keys()
    for k, v in full.store.state_dict().items():
        assert torch.equal(v, resumed.store.state_dict()[k]), k
    assert json.loads((resumed.run_dir / "summary.json").read_text())["rounds"] == 4


def test_half_written_round_is_not_trusted(tmp_path):
    clean = run_exp(tmp_path, "clean", rounds=3)
    run_exp(tmp_path, "crashed", rounds=2)
    d = tmp_path / "crashed"
    # a crash after round 3's metrics row but before (or while) writing its checkpoint
    with open(d / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"round": 3, "clients": 3, "accuracy": 0.999, "bogus": True}) + "\n")
        f.write('{"round": 4, "accur')  # and a torn line
    (d / "checkpoints" / "round_00003.tmp").mkdir()
    (d / "checkpoints" / "round_00003.tmp" / "server.safetensors").write_bytes(b"garbage")
    assert checkpoint.latest(d / "checkpoints").name == "round_00002"
    run_exp(tmp_path, "crashed", rounds=3, resume=True)
    rows = read_rows(d)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert "bogus" not in rows[2]
    assert timeless(rows) == timeless(read_rows(clean.run_dir))
    assert not (d / "checkpoints" / "round_00003.tmp").exists()
    assert (d / "checkpoints" / "LATEST").read_text().strip() == "round_00003"


def test_resume_of_a_finished_run_runs_nothing(tmp_path):
    exp = run_exp(tmp_path, "done", rounds=2)
    before = read_rows(exp.run_dir)
    run_exp(tmp_path, "done", rounds=2, resume=True)
    assert read_rows(exp.run_dir) == before


# ----------------------------------------------------------------------------- determinism

def test_same_seed_same_metrics_different_seed_different(tmp_path):
    a = read_rows(run_exp(tmp_path, "a", "seed=3").run_dir)
    b = read_rows(run_exp(tmp_path, "b", "seed=3").run_dir)
    c = read_rows(run_exp(tmp_path, "c", "seed=4").run_dir)
    assert timeless(a) == timeless(b)
    assert [r["train_loss"] for r in a] != [r["train_loss"] for r in c]
    assert [r["test_loss"] for r in a] != [r["test_loss"] for r in c]


def test_sample_cohort(tmp_path):
    cfg = make_cfg(tmp_path, "x", "sample_fraction=0.3", "seed=7")
    cohorts = [sample_cohort(cfg, r, 10) for r in range(20)]
    for c in cohorts:
        assert len(c) == 3 and len(set(c)) == 3 and c == sorted(c)
        assert all(0 <= i < 10 for i in c)
    # deterministic per (seed, round) ...
    assert cohorts == [sample_cohort(make_cfg(tmp_path, "y", "sample_fraction=0.3", "seed=7"), r, 10)
                       for r in range(20)]
    # ... varies across rounds and with the seed
    assert len({tuple(c) for c in cohorts}) > 5
    other = [sample_cohort(make_cfg(tmp_path, "z", "sample_fraction=0.3", "seed=8"), r, 10) for r in range(20)]
    assert other != cohorts
    # clients_per_round overrides sample_fraction
    cfg5 = make_cfg(tmp_path, "x", "sample_fraction=0.3", "clients_per_round=5")
    assert all(len(sample_cohort(cfg5, r, 10)) == 5 for r in range(5))
    # fraction 1 -> everyone; tiny fraction -> at least one client
    assert sample_cohort(make_cfg(tmp_path, "x"), 0, 10) == list(range(10))
    assert len(sample_cohort(make_cfg(tmp_path, "x", "sample_fraction=0.01"), 0, 10)) == 1
    with pytest.raises(ConfigError, match="exceeds"):
        sample_cohort(make_cfg(tmp_path, "x", "clients_per_round=11"), 0, 10)


# ----------------------------------------------------------------------------- non-finite replies

class NaNClient(FedAvgClient):
    """FedAvg's client, except client 1 replies with a NaN model."""

    def train(self, msg):
        reply = super().train(msg)
        if self.ctx.cid == 1:
            reply.arrays = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                            for k, v in reply.arrays.items()}
        return reply


NAN_ALGO = "test_engine_nan_client"
if NAN_ALGO not in ALGORITHMS:
    algorithms.register(NAN_ALGO, None, FedAvgServer, NaNClient, help="test: client 1 sends NaN")


def test_nonfinite_reply_fails_the_run(tmp_path):
    with pytest.raises(MMFLError, match="non-finite") as e:
        run_exp(tmp_path, "nanrun", f"algorithm.name={NAN_ALGO}", "on_nonfinite=fail")
    assert "client 1" in str(e.value)
    assert not (tmp_path / "nanrun" / "metrics.jsonl").exists()  # no row for the failed round


def test_nonfinite_reply_dropped(tmp_path):
    exp = run_exp(tmp_path, "nanrun", f"algorithm.name={NAN_ALGO}", "on_nonfinite=drop", "keep_checkpoints=2",
                  rounds=2)
    rows = read_rows(exp.run_dir)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped"] == [1]
        assert row["clients"] == 3 and row["clients_replied"] == 2
        assert 0.0 <= row["accuracy"] <= 1.0
    assert all(bool(torch.isfinite(v).all()) for v in exp.server.model.state_dict().values())
    assert len(exp.store) == 0  # FedAvg keeps no client state (and the dropped one saved none)
    # round 1's global model is FedAvg's average over clients 0 and 2 only
    plain = experiment(make_cfg(tmp_path, "plain"))
    plain.transport.begin_round(0)
    replies = plain.transport.send("train", plain.server.configure_train(0, [0, 2]))
    expected = plain.server.aggregate(0, replies)
    server, _, _ = checkpoint.load(exp.run_dir / "checkpoints" / "round_00001")
    for k, v in expected.items():
        assert torch.allclose(server["model/" + k], v, rtol=0, atol=1e-7), k


# ----------------------------------------------------------------------------- checkpoints

def test_keep_checkpoints(tmp_path):
    exp = run_exp(tmp_path, "keep1", rounds=3)
    root = exp.run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "round_00003"]  # named by rounds completed
    assert (root / "LATEST").read_text().strip() == "round_00003"
    assert checkpoint.latest(root) == root / "round_00003"
    server, clients, meta = checkpoint.load(root / "round_00003")
    assert meta == {"round": 3}
    for k, v in exp.server.state_dict().items():
        assert torch.equal(server[k], v)
    exp2 = run_exp(tmp_path, "keep2", "keep_checkpoints=2", rounds=3)
    root2 = exp2.run_dir / "checkpoints"
    assert sorted(p.name for p in root2.iterdir()) == ["LATEST", "round_00002", "round_00003"]
    assert (root2 / "LATEST").read_text().strip() == "round_00003"


def test_corrupt_checkpoint_is_a_user_error(tmp_path):
    exp = run_exp(tmp_path, "corrupt", rounds=1)
    (exp.run_dir / "checkpoints" / "round_00001" / "server.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(MMFLError, match="unreadable"):
        run_exp(tmp_path, "corrupt", rounds=2, resume=True)


# ----------------------------------------------------------------------------- client state store

def test_client_state_store_round_trip():
    store = ClientStateStore()
    a = {"prev/w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "c/b": torch.tensor([1.5, -2.0])}
    b = {"model/n": torch.tensor(4, dtype=torch.int64)}
    store.save(0, a)
    store.save(12, b)
    assert len(store) == 2
    assert store.nbytes() == 24 + 8 + 8
    flat = store.state_dict()
    assert set(flat) == {"0/prev/w", "0/c/b", "12/model/n"}
    back = ClientStateStore()
    back.load_state_dict(flat)
    assert len(back) == 2 and back.nbytes() == store.nbytes()
    for cid, state in ((0, a), (12, b)):
        got = back.load(cid)
        assert got.keys() == state.keys()
        assert all(torch.equal(got[k], state[k]) for k in state)
    assert back.load(5) == {}
    # load returns a copy: mutating it does not touch the store
    got = back.load(0)
    got["extra"] = torch.zeros(1)
    assert "extra" not in back.load(0)
    # saving an empty state forgets the client
    back.save(12, {})
    assert len(back) == 1 and back.load(12) == {}
    # and survives a safetensors round trip (as in checkpoints)
    from safetensors.torch import load, save
    again = ClientStateStore()
    again.load_state_dict(load(save(store.state_dict())))
    assert all(torch.equal(again.state_dict()[k], v) for k, v in flat.items())


def test_a_nonfinite_loss_or_accuracy_stops_the_run_with_one_line():
    from mmfl.engine.runner import _check_finite

    _check_finite({"accuracy": 0.5, "train_loss": 1.0, "distill_loss": 0.1, "bytes_up": 3}, 0)
    for key in ("accuracy", "train_loss", "distill_loss", "server_align_loss"):
        with pytest.raises(MMFLError, match=rf"^round 2: {key} is nan; training diverged"):
            _check_finite({"accuracy": 0.5, key: float("nan")}, 1)
