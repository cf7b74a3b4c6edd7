"""Attack simulation ([attack], mmfl.engine.attack) and reply validation (mmfl.core.replies):
each attack kind changes what it should on hand tensors, the malicious set is seeded and fixed,
and a bad reply (wrong shape, missing or absurd num_examples) is dropped with its reason
logged, or fails the run with one line; never a traceback."""

from __future__ import annotations


import pytest
import torch

from mmfl.algorithms.fedavg import FedAvgClient
from mmfl.cli import main
from mmfl.config import load_config
from mmfl.core.message import Message
from mmfl.core.replies import MAX_COUNT, ReplySchema, check_reply, model_schema
from mmfl.data.base import ArrayDataset
from mmfl.engine.attack import Attack, attack_arrays, malicious_clients

from mmfl.errors import ConfigError, MMFLError
from mmfl.schema import AttackConfig

from helpers import DIGITS as BASE, experiment, rows, run


def run_exp(tmp_path, name, *over, rounds=2) -> list[dict]:
    return rows(run(tmp_path, name, *over, rounds=rounds))


# ----------------------------------------------------------------------------- the attacks by hand

G = {"w": torch.tensor([1.0, 2.0, 3.0]), "n": torch.tensor(5)}
W = {"w": torch.tensor([2.0, 2.0, 1.0]), "n": torch.tensor(6)}  # update w - g = [1, 0, -2]


def attacked(kind, received=G, sent=W, **kw):
    return attack_arrays(kind, received, sent, AttackConfig(kind=kind, **kw), torch.Generator().manual_seed(0))


def test_sign_flip_reverses_and_scales_the_update():
    out = attacked("sign_flip", scale=10.0)
    assert out["w"].tolist() == [1 - 10, 2 - 0, 3 + 20]  # g - 10 (w - g)
    assert int(out["n"]) == 6  # integer entries are never changed


def test_scale_multiplies_the_update():
    assert attacked("scale", scale=3.0)["w"].tolist() == [1 + 3, 2 + 0, 3 - 6]  # g + 3 (w - g)


def test_constant_update_is_the_target_everywhere():
    assert attacked("constant", target=0.5)["w"].tolist() == [1.5, 2.5, 3.5]  # g + 0.5


def test_gaussian_replaces_the_update_by_seeded_noise():
    a, b = attacked("gaussian", noise_std=2.0), attacked("gaussian", noise_std=2.0)
    assert torch.equal(a["w"], b["w"])  # same generator seed, same noise
    noise = 2.0 * torch.randn(3, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(a["w"], G["w"] + noise)


def test_a_key_the_client_did_not_receive_is_attacked_relative_to_zero():
    out = attacked("sign_flip", received={}, sent={"rep": torch.tensor([[1.0, -2.0]])}, scale=2.0)
    assert out["rep"].tolist() == [[-2.0, 4.0]]


def test_representation_attacks_permute_or_randomize_rows():
    reps = torch.arange(12.0).reshape(6, 2)
    shuffled = attacked("shuffle_reps", received={}, sent={"rep/image": reps})["rep/image"]
    assert not torch.equal(shuffled, reps)
    assert sorted(map(tuple, shuffled.tolist())) == sorted(map(tuple, reps.tolist()))  # the same rows, moved
    rand = attacked("random_reps", received={}, sent={"rep/image": reps})["rep/image"]
    assert rand.shape == reps.shape and not any(torch.equal(r, q) for r in rand for q in reps)
    # model weights the client received are left alone by the representation attacks
    assert torch.equal(attacked("shuffle_reps")["w"], W["w"])


def test_inflate_examples_sets_every_count_and_leaves_arrays_alone():
    att = Attack(AttackConfig(kind="inflate_examples", fraction=1.0, examples=10 ** 9), 2, seed=0)
    reply = Message(arrays=dict(W), scalars={"num_examples": 7, "examples/enc.a": 3, "train_loss": 0.5})
    out = att.reply(0, "train", Message(arrays=G), reply, seed=1)
    assert out.scalars == {"num_examples": 10 ** 9, "examples/enc.a": 10 ** 9, "train_loss": 0.5}
    assert torch.equal(out.arrays["w"], W["w"])
    assert att.reply(0, "evaluate", Message(), reply, seed=1) is reply  # only train replies


def test_label_flip_changes_only_the_malicious_clients_labels():
    att = Attack(AttackConfig(kind="label_flip", fraction=0.5), 2, seed=0)
    bad, good = att.clients[0], 1 - att.clients[0]
    data = ArrayDataset({"x": torch.zeros(4, 1)}, torch.tensor([0, 1, 2, 9]))
    assert att.training_data(bad, data, 10).labels.tolist() == [9, 8, 7, 0]  # y -> C - 1 - y
    assert att.training_data(good, data, 10) is data
    reply = Message(arrays=dict(W), scalars={"num_examples": 4})
    assert att.reply(bad, "train", Message(arrays=G), reply, seed=1) is reply  # the reply is its own


def test_malicious_set_is_seeded_and_sized_by_fraction():
    a = malicious_clients(0.2, 50, seed=0)
    assert len(a) == 10 and a == malicious_clients(0.2, 50, seed=0) and a == sorted(set(a))
    assert a != malicious_clients(0.2, 50, seed=1)
    assert malicious_clients(0.0, 50, seed=0) == [] and malicious_clients(1.0, 4, seed=0) == [0, 1, 2, 3]


def test_attack_config_errors_name_the_field():
    for over, field in [("attack.kind=\"nope\"", "attack.kind"), ("attack.fraction=1.5", "attack.fraction"),
                        ("attack.noise_std=0", "attack.noise_std"), ("attack.scale=\"x\"", "attack.scale"),
                        ("attack.bogus=1", "attack.bogus"), ("on_bad_reply=\"ignore\"", "on_bad_reply")]:
        with pytest.raises(ConfigError, match=field):
            load_config(None, [*BASE, over])


def test_representation_attack_on_a_weight_averaging_algorithm_is_a_config_error(tmp_path):
    cfg = load_config(None, [*BASE, f"output_dir={tmp_path}", "attack.kind=\"shuffle_reps\""])
    with pytest.raises(ConfigError, match="attack.kind"):
        experiment(cfg)


# ----------------------------------------------------------------------------- the reply check by hand

SCHEMA = model_schema({"w": torch.zeros(3), "b": torch.zeros(2, dtype=torch.float64)}, client_keys=["w", "b"])


@pytest.mark.parametrize("reply,reason", [
    (Message({"w": torch.zeros(4)}, {"num_examples": 5}), "array 'w' has shape [4], expected [3]"),
    (Message({"w": torch.zeros(3, dtype=torch.float64)}, {"num_examples": 5}), "dtype torch.float64"),
    (Message({"z": torch.zeros(3)}, {"num_examples": 5}), "unexpected array 'z'"),
    (Message({"w": torch.zeros(3)}, {}), "scalar 'num_examples' is missing"),
    (Message({"w": torch.zeros(3)}, {"num_examples": -10 ** 9}), "outside [1, 10]"),
    (Message({"w": torch.zeros(3)}, {"num_examples": 10 ** 9}), "outside [1, 10]"),
    (Message({"w": torch.zeros(3)}, {"num_examples": 0}), "outside [1, 10]"),
    (Message({"w": torch.zeros(3)}, {"num_examples": 2.5}), "must be an integer"),
    (Message({"w": torch.zeros(3)}, {"num_examples": True}), "must be an integer"),
    (Message({"w": torch.zeros(3)}, {"num_examples": 5, "examples/enc": 11}), "'examples/enc' = 11"),
    (Message({"w": torch.tensor([0.0, float("nan"), 0.0])}, {"num_examples": 5}), "NaN/inf"),
])
def test_check_reply_names_what_is_wrong(reply, reason):
    assert reason in check_reply(SCHEMA, reply, data_size=10)


def test_check_reply_accepts_a_subset_of_keys_and_integral_counts():
    assert check_reply(SCHEMA, Message({"w": torch.ones(3)}, {"num_examples": 10, "examples/enc": 0}), 10) is None
    w = {"w": torch.ones(3)}  # a model reply carries at least one model entry (tests/test_bad_inputs.py)
    assert check_reply(SCHEMA, Message(w, {"num_examples": 4.0}), 10) is None  # 4.0: an integer in a float
    assert check_reply(SCHEMA, Message(w, {"num_examples": MAX_COUNT}), None) is None  # size unknown: the bound
    free = ReplySchema(free=("proto/",), required=("proto/a",))
    assert check_reply(free, Message({"proto/a": torch.ones(7, 2)}, {"num_examples": 1}), 10) is None
    assert "'proto/a' is missing" in check_reply(free, Message({}, {"num_examples": 1}), 10)


def test_default_schema_allows_only_the_modules_of_the_clients_modalities(tmp_path):
    cfg = load_config(None, ["data.name=mfeat", 'data.views=["pix", "fou"]', 'case="D"', "partition.num_clients=4",
                             "model.name=multimodal", "model.feat_dim=8", "model.mlp_hidden=[8]", "threads=1",
                             f"output_dir={tmp_path}"])
    exp = experiment(cfg)
    fed = exp.federation
    uni = next(c for c in range(fed.num_clients) if len(fed.modalities_of(c)) == 1)
    other = next(m for m in fed.meta.modalities if m not in fed.modalities_of(uni))
    schema = exp.server.reply_schema("train", uni)
    assert schema.arrays and not any(f"encoders.{other}." in k for k in schema.arrays)
    assert any(f"encoders.{other}." in k for k in exp.server.reply_schema("train", 0 if uni else 1).arrays)


# ----------------------------------------------------------------------------- bad replies in a run

def _corrupt(kind):
    def reply(r: Message) -> Message:
        if kind == "shape":
            k = next(iter(r.arrays))
            return Message({**r.arrays, k: torch.zeros(1)}, r.scalars)
        if kind == "nan":
            k = next(iter(r.arrays))
            return Message({**r.arrays, k: torch.full_like(r.arrays[k], float("nan"))}, r.scalars)
        if kind == "missing":
            return Message(r.arrays, {k: v for k, v in r.scalars.items() if k != "num_examples"})
        return Message(r.arrays, {**r.scalars, "num_examples": int(kind)})
    return reply


@pytest.fixture
def client1_sends(monkeypatch):
    """Make client 1's FedAvg train reply bad in the given way."""
    def patch(kind):
        orig = FedAvgClient.finish

        def finish(self, model, msg, stats):
            reply = orig(self, model, msg, stats)
            return _corrupt(kind)(reply) if self.ctx.cid == 1 else reply
        monkeypatch.setattr(FedAvgClient, "finish", finish)
    return patch


@pytest.mark.parametrize("kind,reason", [("shape", "has shape [1], expected"),
                                         ("missing", "'num_examples' is missing"),
                                         ("-1000000000", "'num_examples' = -1e+09 is outside"),
                                         ("1000000000", "'num_examples' = 1e+09 is outside")])
def test_a_bad_reply_is_dropped_with_its_reason(tmp_path, client1_sends, caplog, kind, reason):
    client1_sends(kind)
    rows = run_exp(tmp_path, f"bad{kind}")
    for row in rows:
        assert row["replies_rejected"] == 1 and row["dropped"] == [1] and row["clients_replied"] == 2
        assert row["rejected"][0]["client"] == 1 and reason in row["rejected"][0]["reason"]
    assert any(reason in r.getMessage() for r in caplog.records)  # the reason is logged


def test_a_rejected_reply_is_dropped_exactly_like_a_nonfinite_one(tmp_path, client1_sends):
    client1_sends("shape")
    rejected = run_exp(tmp_path, "shape")
    client1_sends("nan")
    nan = run_exp(tmp_path, "nan", "on_nonfinite=\"drop\"")
    assert [r["accuracy"] for r in rejected] == [r["accuracy"] for r in nan]
    assert [r["dropped"] for r in nan] == [[1], [1]] and "replies_rejected" not in nan[0]


@pytest.mark.parametrize("kind", ["shape", "missing", "-1000000000"])
def test_a_bad_reply_with_fail_is_one_line(tmp_path, client1_sends, capsys, kind):
    client1_sends(kind)
    path = tmp_path / "c.toml"
    path.write_text("rounds = 1\n")
    rc = main(["run", str(path), "--no-progress", *[a for o in BASE for a in ("--set", o)],
               "--set", f"output_dir='{tmp_path}'", "--set", "rounds=1", "--set", "on_bad_reply=\"fail\""])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmfl: error: client 1 sent a bad reply"), err


def test_attack_run_logs_the_fixed_malicious_clients(tmp_path):
    rows = run_exp(tmp_path, "flip", "attack.kind=\"sign_flip\"", "attack.fraction=0.34", rounds=3)
    bad = malicious_clients(0.34, 3, seed=0)
    assert len(bad) == 1
    assert [r["attack/clients"] for r in rows] == [bad] * 3 and rows[0]["attack/kind"] == "sign_flip"
    assert "replies_rejected" not in rows[0]  # a sign flip fits the schema: validation cannot catch it


def test_inflated_examples_attack_is_caught_by_validation(tmp_path):
    rows = run_exp(tmp_path, "inflate", "attack.kind=\"inflate_examples\"", "attack.fraction=0.34")
    bad = malicious_clients(0.34, 3, seed=0)
    assert all(r["dropped"] == bad and r["replies_rejected"] == 1 for r in rows)
    assert "'num_examples' = 1e+09 is outside" in rows[0]["rejected"][0]["reason"]


def test_label_flip_run_differs_from_clean_and_batched_training_falls_back(tmp_path):
    clean = run_exp(tmp_path, "clean", rounds=1)
    flip = run_exp(tmp_path, "lflip", "attack.kind=\"label_flip\"", "attack.fraction=0.34", "batch_clients=true",
                   rounds=1)
    assert flip[0]["train_loss"] != clean[0]["train_loss"]
    assert "one by one" in flip[0]["batched_fallback"]
