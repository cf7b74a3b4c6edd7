"""The disk-backed client state store: same contents as the in-memory store, checkpoints
that hold only a round's changes, exact resume after a crash at any point of the
checkpoint protocol, and runs that equal memory-store runs bit for bit."""

from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file

from mmfl.engine.state_store import (AUTO_DISK_CLIENTS, ClientStateStore, DiskClientStateStore, LazyTensors,
                               make_store)

from helpers import rows, run as run_with, timeless as timeless_rows


def states():
    return {
        0: {"prev/w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "c/b": torch.tensor([1.5, -2.0])},
        7: {"prev/w": torch.ones(2, 3), "c/b": torch.zeros(2)},
        12: {"model/n": torch.tensor(4, dtype=torch.int64), "h": torch.ones(3, dtype=torch.float16)},
    }


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_disk_store_round_trip_equals_memory_store(tmp_path):
    disk, mem = DiskClientStateStore(tmp_path / "s"), ClientStateStore()
    for cid, s in states().items():
        disk.save(cid, s)
        mem.save(cid, s)
    for cid in (0, 7, 12, 3):  # before commit: from the journal
        assert same(disk.load(cid), mem.load(cid))
    disk.write_checkpoint(tmp_path / "c1.safetensors")
    disk.commit()
    for cid in (0, 7, 12, 3):  # after: from the per-key files
        assert same(disk.load(cid), mem.load(cid))
    assert len(disk) == 3 and disk.nbytes() == mem.nbytes()
    assert same(disk.state_dict(), mem.state_dict())
    # a key seen with another shape, a cleared client, a reopened store
    disk.save(7, {"prev/w": torch.ones(4)})
    disk.save(0, {})
    disk.write_checkpoint(tmp_path / "c2.safetensors")
    disk.commit()
    disk.close()
    again = DiskClientStateStore(tmp_path / "s")
    assert again.load(0) == {} and same(again.load(7), {"prev/w": torch.ones(4)})
    assert same(again.load(12), states()[12]) and len(again) == 2
    # the second checkpoint holds that round's changes only (client 0 marked deleted)
    delta = load_file(str(tmp_path / "c2.safetensors"))
    assert sorted(delta) == ["0/.deleted", "7/prev/w"]


def test_replaying_the_latest_checkpoint_restores_the_store_after_a_crash(tmp_path):
    # round 1 committed; round 2's checkpoint written, then a crash before (or during) the commit
    disk = DiskClientStateStore(tmp_path / "s")
    for cid, s in states().items():
        disk.save(cid, s)
    disk.write_checkpoint(tmp_path / "r1.safetensors")
    disk.commit()
    disk.save(7, {"prev/w": torch.full((2, 3), 9.0), "c/b": torch.ones(2)})
    disk.save(12, {})
    disk.write_checkpoint(tmp_path / "r2.safetensors")
    expected = {cid: disk.load(cid) for cid in (0, 7, 12)}
    disk.close()  # crash: the journal is lost
    crashed = DiskClientStateStore(tmp_path / "s")
    assert same(crashed.load(7), states()[7])  # files are one round behind
    crashed.load_state_dict(LazyTensors(tmp_path / "r2.safetensors"))
    for cid, s in expected.items():
        assert same(crashed.load(cid), s)
    crashed.load_state_dict(LazyTensors(tmp_path / "r2.safetensors"))  # idempotent
    for cid, s in expected.items():
        assert same(crashed.load(cid), s)
    # and uncommitted saves of a crashed round are discarded when the store is reopened
    crashed.save(0, {"x": torch.ones(1)})
    crashed.close()
    assert same(DiskClientStateStore(tmp_path / "s").load(0), expected[0])


def test_make_store_auto_threshold(tmp_path):
    assert isinstance(make_store("auto", AUTO_DISK_CLIENTS - 1, tmp_path), ClientStateStore)
    assert isinstance(make_store("auto", AUTO_DISK_CLIENTS, tmp_path), DiskClientStateStore)
    assert isinstance(make_store("disk", 2, tmp_path), DiskClientStateStore)
    assert isinstance(make_store("memory", 10**6, tmp_path), ClientStateStore)


BASE = ["data.name=digits", "partition.num_clients=6", "clients_per_round=3", "model.name=mlp",
        "model.hidden=[16]", "train.local_epochs=1", "train.batch_size=128", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]


def run(tmp_path, name, *over, rounds, resume=False):
    return run_with(tmp_path, name, *over, base=BASE, rounds=rounds, resume=resume)


def timeless(exp):
    return timeless_rows(rows(exp))


@pytest.mark.parametrize("algo", ["scaffold", "moon"])
def test_disk_store_runs_and_resumes_exactly_like_memory(tmp_path, algo):
    mem = run(tmp_path, "mem", f"algorithm.name={algo}", "state_store=memory", rounds=4)
    disk = run(tmp_path, "disk", f"algorithm.name={algo}", "state_store=disk", rounds=4)
    assert isinstance(disk.store, DiskClientStateStore) and (disk.run_dir / "client_state" / "manifest.json").is_file()
    assert timeless(mem) == timeless(disk)
    assert same(mem.store.state_dict(), disk.store.state_dict())
    # interrupted after round 2, resumed to 4
    run(tmp_path, "split", f"algorithm.name={algo}", "state_store=disk", rounds=2)
    resumed = run(tmp_path, "split", f"algorithm.name={algo}", "state_store=disk", rounds=4, resume=True)
    assert timeless(resumed) == timeless(mem)
    assert same(resumed.store.state_dict(), mem.store.state_dict())
    for k, v in mem.server.state_dict().items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k
