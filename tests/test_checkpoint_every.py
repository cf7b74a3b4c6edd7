"""``checkpoint_every``: checkpoints every N rounds and after the last; a crash between two
checkpoints resumes from the newest one bit-exact (memory and disk client-state stores); the
disk store's journal holds the changes of every round since its last commit, once per client."""

from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file


from mmfl.engine.state_store import DiskClientStateStore

from helpers import timeless as timeless_rows, config, experiment, rows


BASE = ["data.name=digits", "partition.num_clients=6", "clients_per_round=3", "model.name=mlp",
        "model.hidden=[16]", "train.local_epochs=1", "train.batch_size=128", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1",
        "algorithm.name=scaffold"]


def make(tmp_path, name, *over, rounds=5):
    return experiment(config(tmp_path, name, *over, base=BASE, rounds=rounds))


def timeless(exp):
    return timeless_rows(rows(exp))


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_every_3_of_5_rounds_writes_rounds_3_and_5(tmp_path):
    exp = make(tmp_path, "every3", "checkpoint_every=3", "keep_checkpoints=10")
    exp.run()
    ckpts = sorted(p.name for p in (exp.run_dir / "checkpoints").glob("round_*"))
    assert ckpts == ["round_00003", "round_00005"]
    assert (exp.run_dir / "checkpoints" / "LATEST").read_text().strip() == "round_00005"
    assert [r["round"] for r in timeless(exp)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_crash_between_checkpoints_resumes_from_the_newest_bit_exact(tmp_path, store):
    over = ["checkpoint_every=3", f"state_store={store}"]
    full = make(tmp_path, "full", *over)
    full.run()
    crashed = make(tmp_path, "crashed", *over)
    real_round = crashed.server.round

    def dies_in_round_5(rnd, cohort, transport):
        if rnd == 4:  # round 4 ran, its metrics row is written, its checkpoint was skipped
            raise RuntimeError("crash")
        return real_round(rnd, cohort, transport)

    crashed.server.round = dies_in_round_5
    with pytest.raises(RuntimeError, match="crash"):
        crashed.run()
    if store == "disk":
        crashed.store.close()  # the process is gone: its journal (round 4's changes) with it
    d = crashed.run_dir
    assert [r["round"] for r in timeless(crashed)] == [1, 2, 3, 4]
    assert sorted(p.name for p in (d / "checkpoints").glob("round_*")) == ["round_00003"]
    resumed = make(tmp_path, "crashed", *over)
    resumed.run(resume=True)
    assert [r["round"] for r in timeless(resumed)] == [1, 2, 3, 4, 5]  # round 4 dropped and rerun
    assert timeless(resumed) == timeless(full)
    assert same_state(full.server.state_dict(), resumed.server.state_dict())
    assert same_state(full.store.state_dict(), resumed.store.state_dict())
    assert full.store.state_dict()  # SCAFFOLD's control variates: there is client state to compare


def test_disk_store_journal_keeps_one_slot_per_client_until_commit(tmp_path):
    disk = DiskClientStateStore(tmp_path / "s")
    disk.save(0, {"c": torch.zeros(4)})
    disk.save(1, {"c": torch.ones(4)})
    size = disk._jsize
    disk.save(0, {"c": torch.full((4,), 2.0)})  # a second round before any checkpoint
    assert disk._jsize == size  # same slot, no growth
    disk.save(2, {"c": torch.full((4,), 3.0)})
    disk.write_checkpoint(tmp_path / "c.safetensors")
    delta = load_file(str(tmp_path / "c.safetensors"))  # both rounds' changes, the newest of each
    assert sorted(delta) == ["0/c", "1/c", "2/c"]
    assert torch.equal(delta["0/c"], torch.full((4,), 2.0)) and torch.equal(delta["1/c"], torch.ones(4))
    disk.commit()
    disk.close()
    again = DiskClientStateStore(tmp_path / "s")
    assert torch.equal(again.load(0)["c"], torch.full((4,), 2.0)) and torch.equal(again.load(2)["c"], delta["2/c"])
