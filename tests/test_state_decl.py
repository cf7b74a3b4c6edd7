"""Mechanism check of declared algorithm state (mmfl.core.state): a server that declares one
field of every kind round-trips bit-exactly through a safetensors checkpoint, and a
checkpoint with a missing or an extra key is refused with one error naming the key."""

import pytest
import torch
from safetensors.torch import load, save
from torch import nn

from mmfl.core.state import (StateError, Stateful, dict_of, module, optimizer, per_client, read, record, rng, scalar,
                             tensor, tensors, write)


class Base(Stateful):
    state_fields = {"model": module()}

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


class Everything(Base):
    state_fields = {"opt": optimizer(), "alias": optimizer(), "p": tensor(), "maybe": tensor(), "c": tensors(),
                    "uploads": per_client(), "empty": per_client(), "groups": dict_of(per_client()),
                    "xs": per_client(tensor()), "round": scalar(), "lr": scalar(), "done": scalar(), "gen": rng(),
                    "stats": record(P=tensor(), n=scalar())}

    def __init__(self, seed: int):
        super().__init__(seed)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.alias = self.opt  # the same optimizer under two names: saved once
        self.p = torch.zeros(3, 3, dtype=torch.float64)
        self.maybe = None
        self.c = {}
        self.uploads, self.empty = {}, {}
        self.groups = {"a": {}, "b": {}}
        self.xs = {}
        self.round, self.lr, self.done = -1, 0.0, False
        self.gen = torch.Generator().manual_seed(seed)
        self.stats = {"P": torch.zeros(2), "n": 0}

    def step(self):
        x = torch.randn(5, 3, generator=self.gen)
        self.opt.zero_grad()
        self.model(x).square().mean().backward()
        self.opt.step()
        self.p += torch.rand(3, 3, generator=self.gen, dtype=torch.float64)
        self.c = {"w/0": torch.randn(2, generator=self.gen), "b": torch.tensor([True, False])}
        self.uploads[7] = {"enc.weight": torch.randn(2, 2, generator=self.gen), "n": torch.tensor(3)}
        self.uploads[12] = {"enc.weight": torch.randn(2, 2, generator=self.gen)}
        self.groups["a"][3] = {"k": torch.randn(4, generator=self.gen)}
        self.xs[2] = torch.arange(4, dtype=torch.int32)
        self.round, self.lr, self.done = self.round + 1, 0.1 + 1e-17 * self.round, True
        self.stats = {"P": self.stats["P"] + 1, "n": self.stats["n"] + 2}


def _checkpoint(sd):
    return load(save({k: v.contiguous() for k, v in sd.items()}))


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_declared_server_round_trips_every_kind_bit_exactly():
    run = Everything(0)
    run.step(), run.step()
    sd = run.state_dict()
    assert not any(k.startswith(("alias/", "empty", "maybe")) for k in sd)  # aliases once; empty/None cost nothing
    assert {"round", "lr", "done", "gen", "p", "xs/2", "groups/a/3/k", "uploads/7/n", "stats/P", "stats/n"} <= set(sd)
    fresh = Everything(1)
    fresh.load_state_dict(_checkpoint(sd))
    assert _same(fresh.state_dict(), sd)
    assert fresh.alias is fresh.opt and fresh.maybe is None and fresh.empty == {}
    assert fresh.groups == {"a": {3: fresh.groups["a"][3]}, "b": {}}  # the empty group survives
    assert (fresh.round, fresh.lr, fresh.done) == (run.round, run.lr, run.done)
    assert type(fresh.round) is int and type(fresh.done) is bool
    # continuing gives the same numbers as never stopping (model, Adam moments, RNG stream)
    run.step(), fresh.step()
    assert _same(fresh.state_dict(), run.state_dict())


def test_state_before_the_first_step_round_trips_with_empty_optimizer_and_dicts():
    sd = Everything(0).state_dict()
    assert not any(k.startswith(("opt/", "uploads", "xs", "groups")) for k in sd)
    fresh = Everything(1)
    fresh.load_state_dict(_checkpoint(sd))
    assert _same(fresh.state_dict(), sd) and fresh.uploads == {} and len(fresh.opt.state) == 0


def test_missing_or_extra_checkpoint_key_is_one_error_naming_it():
    run = Everything(0)
    run.step()
    sd = run.state_dict()
    missing = {k: v for k, v in sd.items() if k != "model/0.weight"}
    with pytest.raises(StateError, match=r"Everything: .*missing key 'model/0.weight'"):
        Everything(1).load_state_dict(missing)
    with pytest.raises(StateError, match=r"missing key 'round'"):
        Everything(1).load_state_dict({k: v for k, v in sd.items() if k != "round"})
    with pytest.raises(StateError, match=r"missing key 'stats/n'"):
        Everything(1).load_state_dict({k: v for k, v in sd.items() if k != "stats/n"})
    with pytest.raises(StateError, match=r"unexpected key 'velocity/w'"):
        Everything(1).load_state_dict({**sd, "velocity/w": torch.zeros(1)})
    with pytest.raises(StateError, match=r"unexpected key 'model/extra.weight'"):
        Everything(1).load_state_dict({**sd, "model/extra.weight": torch.zeros(1)})
    with pytest.raises(StateError, match=r"unexpected key 'uploads/seven/n'"):
        Everything(1).load_state_dict({**sd, "uploads/seven/n": torch.zeros(1)})
    with pytest.raises(StateError, match=r"unexpected key 'opt/99/exp_avg'"):
        Everything(1).load_state_dict({**sd, "opt/99/exp_avg": torch.zeros(1)})


def test_client_state_fields_read_and_write_a_flat_ctx_state():
    state = {"prev/w": torch.ones(2), "c/x": torch.zeros(1)}
    assert read(state, "model") == {}  # absent: empty
    assert torch.equal(read(state, "prev")["w"], torch.ones(2))
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    write(state, "prev", {"v": torch.zeros(3)})
    write(state, "sl/opt", opt, optimizer())  # a part may sit under a path
    assert set(state) == {"prev/v", "c/x", "sl/opt/0/momentum_buffer", "sl/opt/1/momentum_buffer"}
    other = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)
    read(state, "sl/opt", optimizer(), other)
    assert all(torch.equal(other.state[q]["momentum_buffer"], opt.state[p]["momentum_buffer"])
               for p, q in zip(model.parameters(), other.param_groups[0]["params"]))
    write(state, "c", None)
    write(state, "sl", None)
    assert set(state) == {"prev/v"}
