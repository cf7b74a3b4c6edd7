"""Every bad input is one line (issue 27, item 5): values that can only be mistakes
(``train.lr = 1e300``, ``rounds = 2**70``, ...), a full disk while the memory store writes
``clients.safetensors``, a NaN/inf reply dropped with a line like every other drop, a reply
without any model array dropped with its reason, and a round whose every reply was dropped:
exit 2 with one line (``on_no_valid_reply = "fail"``, the default) or the model kept with one
line (``"skip"``)."""

from __future__ import annotations

import errno
import json
import logging

import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError

import mmfl.engine.checkpoint  # noqa: F401  (imported first: it keeps the real save_file for the server's file)
from mmfl.algorithms.fedavg import FedAvgClient
from mmfl.cli import main
from mmfl.core.message import Message
from mmfl.core.replies import check_reply, model_schema
from mmfl.engine import pieces
from mmfl.engine.state_store import ClientStateStore

from helpers import config, run_config

BASE = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=128", "threads=1"]


def argv(tmp_path, *over):
    (tmp_path / "c.toml").write_text("")
    sets = sum((["--set", o] for o in [*BASE, f"output_dir={tmp_path}", "name=r", "rounds=2", *over]), [])
    return ["run", str(tmp_path / "c.toml"), "--no-progress", *sets]


def one_line(capsys, args) -> str:
    capsys.readouterr()
    rc = main(args)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("mmfl: error: "), err
    return err


@pytest.mark.parametrize("setting,said", [
    ("train.lr=1e300", "train.lr: must be in (0, 1000]"),
    ("train.weight_decay=1e300", "train.weight_decay: must be in [0, 1000]"),
    ("rounds=1180591620717411303424", "rounds: must be in [1, 10000000]"),  # 2**70
    ("train.local_epochs=1180591620717411303424", "train.local_epochs: must be in [1, 100000]"),
    ("threads=1000000000", "threads: must be in [0, 4096]"),
])
def test_a_value_that_can_only_be_a_mistake_is_one_line(tmp_path, capsys, setting, said):
    assert said in one_line(capsys, argv(tmp_path, setting))


@pytest.mark.parametrize("how", ["safetensors", "oserror", "piece"])
def test_a_full_disk_while_the_memory_store_writes_is_one_line(tmp_path, capsys, monkeypatch, how):
    def no_space(*a, **k):  # the whole-store format calls safetensors' save_file; a piece pieces._write
        if how != "safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    if how == "piece":  # the default: the changed clients' pieces (mmfl.engine.pieces)
        monkeypatch.setattr(pieces, "_write", no_space)
    else:  # the format before pieces: the whole store in clients.safetensors
        monkeypatch.setattr(ClientStateStore, "incremental", False)
        monkeypatch.setattr(safetensors.torch, "save_file", no_space)
    err = one_line(capsys, argv(tmp_path, 'state_store="memory"', "algorithm.name=scaffold"))
    where = "checkpoints/pieces/" if how == "piece" else "clients.safetensors"
    assert where in err and "No space left on device" in err and "--resume" in err
    if how == "piece":
        assert not list((tmp_path / "r" / "checkpoints" / "pieces").glob("*.tmp"))


@pytest.fixture
def client1_sends(monkeypatch):
    """Make client 1's (or every client's) FedAvg train reply what ``change`` makes of it."""
    def patch(change, clients=(1,)):
        orig = FedAvgClient.finish

        def finish(self, model, msg, stats):
            reply = orig(self, model, msg, stats)
            return change(reply) if self.ctx.cid in clients else reply
        monkeypatch.setattr(FedAvgClient, "finish", finish)
    return patch


def nan(r: Message) -> Message:
    k = next(iter(r.arrays))
    return Message({**r.arrays, k: torch.full_like(r.arrays[k], float("nan"))}, r.scalars)


def no_arrays(r: Message) -> Message:
    return Message({}, r.scalars)


def test_a_nonfinite_reply_is_dropped_with_a_line(tmp_path, capsys, caplog, client1_sends):
    client1_sends(nan)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="mmfl"):
        assert main(argv(tmp_path, 'on_nonfinite="drop"')) == 0
    said = [r.getMessage() for r in caplog.records if "dropped client 1's reply" in r.getMessage()]
    assert len(said) == 2 and all("holds NaN/inf" in s for s in said), said


def test_a_reply_without_model_arrays_is_dropped_with_its_reason(tmp_path, caplog, client1_sends):
    schema = model_schema({"w": torch.zeros(2)})
    assert check_reply(schema, Message({}, {"num_examples": 3})) == \
        "the reply carries no model array (none of the model's entries)"
    assert check_reply(schema, Message({"w": torch.zeros(2)}, {"num_examples": 3})) is None
    client1_sends(no_arrays)
    with caplog.at_level(logging.WARNING, logger="mmfl"):
        assert main(argv(tmp_path)) == 0
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["dropped"] == [1] and "no model array" in r["rejected"][0]["reason"] for r in rows)
    assert any("no model array" in r.getMessage() for r in caplog.records)


def test_a_round_with_every_reply_dropped_fails_with_one_line(tmp_path, capsys):
    err = one_line(capsys, argv(tmp_path, 'attack.kind="inflate_examples"', "attack.fraction=1.0"))
    assert "round 1: every client reply was dropped (3 dropped: client(s) 0, 1, 2" in err
    assert not (tmp_path / "r" / "checkpoints").exists()  # stopped before the round's checkpoint


def test_a_round_with_every_reply_dropped_is_kept_with_skip(tmp_path, capsys, client1_sends):
    client1_sends(no_arrays, clients=(0, 1, 2))
    capsys.readouterr()
    assert main(argv(tmp_path, 'on_no_valid_reply="skip"')) == 0
    err = capsys.readouterr().err
    assert err.count("every client reply was dropped") == 2 and "the model is kept" in err
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["no_valid_reply"] for r in rows] == [True, True]
    assert rows[0]["accuracy"] == rows[1]["accuracy"]  # the model never changed


def test_an_overflow_in_training_is_one_line(tmp_path):
    # past the config's bounds (a value set in code): torch's "cannot be converted ... without overflow"
    from mmfl.errors import MMFLError

    cfg = config(tmp_path, "o", 'train.optimizer="sgd"', base=BASE, rounds=1)
    cfg.train.lr = 1e300
    with pytest.raises(MMFLError, match=r"^round 1: a value overflows float32 in training .*train.lr") as e:
        run_config(cfg)
    assert "\n" not in str(e.value)


def test_waits_poll_for_the_event_with_a_scaled_ceiling():
    import conftest

    calls = []
    assert conftest.wait_for(lambda: calls.append(1) or len(calls) >= 3, 10, "three polls", poll=0.001) is True
    assert conftest.patience(300) == 300 * conftest.TIMEOUT_SCALE and conftest.TIMEOUT_SCALE >= 1
    with pytest.raises(AssertionError, match="never: not within .* s \\(MMFL_TEST_TIMEOUT_SCALE="):
        conftest.wait_for(lambda: False, 0.01 / conftest.TIMEOUT_SCALE, "never", poll=0.001)
