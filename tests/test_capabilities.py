"""Every registered algorithm's declared capabilities (mmfl.algorithms.capabilities) are what the
engine does: batched training falls back with the declared reason, streamed aggregation follows
the declared flag, ``[dp]`` / ``[secure_aggregation]`` refuse exactly the algorithms that do not
declare the mode, and ``mmfl list algorithm --capabilities`` prints them. Cheap checks: configs
are resolved and experiments built, nothing trains."""

from __future__ import annotations

import types

import pytest

import mmfl.engine.batched_delivery as engine_batched
from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.capabilities import DP_MODES, algorithms_with, capabilities
from mmfl.algorithms.fedavg import FedAvgServer
from mmfl.cli import main as cli_main
from mmfl.config import resolve_dp, resolve_secure_aggregation
from mmfl.errors import ConfigError
from mmfl.schema import Component

from helpers import config, experiment, run

def own(names) -> list[str]:
    """mmfl's algorithms among ``names`` (other tests of the same process register their own)."""
    return [n for n in names if all(c.__module__.startswith("mmfl.") for c in (ALGORITHMS.get(n).factory.server,
                                                                              ALGORITHMS.get(n).factory.client))]


NAMES = own(ALGORITHMS.names())
BASE = ["data.name=digits", "partition.num_clients=4", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=128", "threads=1"]


def caps(name):
    return capabilities(ALGORITHMS.get(name).factory)


def algo(name, aggregation=None):
    return Component(name, {}, types.SimpleNamespace(aggregation=aggregation))


def test_capabilities_are_computed_once_and_listed_for_every_algorithm():
    assert caps("fedavg") is caps("fedavg")
    assert {"batched", "streaming", "secagg", "dp:central,local,sample"} <= set(caps("fedavg").flags().split())
    assert not caps("centralized").dp_modes and not caps("centralized").secagg  # pooled data: no DP, no SecAgg+
    assert caps("fedavgm").streaming and caps("fedadam").streaming  # server_step after the fold keeps streaming
    assert not caps("scaffold").streaming and "overrides aggregate" in caps("scaffold").reason("streaming")
    assert caps("moon").stateful_clients and not caps("fedavg").stateful_clients
    assert caps("fedfomo").personalized_eval and not caps("fedavg").personalized_eval


@pytest.mark.parametrize("mode", DP_MODES)
def test_dp_refuses_exactly_the_algorithms_not_declaring_the_mode(mode):
    names = NAMES
    refused = []
    for name in names:
        try:
            resolve_dp({"mode": mode, "noise_multiplier": 0.5}, algo(name))
        except ConfigError as e:
            refused.append(name)
            assert "\n" not in str(e) and "supported: " in str(e)
            assert own(str(e).split("supported: ")[1].split(", ")) == own(algorithms_with("dp:" + mode))
    assert sorted(set(names) - set(refused)) == sorted(own(algorithms_with("dp:" + mode)))
    assert [n for n in names if mode in caps(n).dp_modes] == own(algorithms_with("dp:" + mode))


def test_secure_aggregation_refuses_exactly_the_algorithms_not_declaring_it():
    run = types.SimpleNamespace(clients_per_round=3, sample_fraction=1.0)
    for name in NAMES:
        try:
            resolve_secure_aggregation({"protocol": "secaggplus"}, algo(name), None, run, None, None)
            accepted = True
        except ConfigError as e:
            accepted = False
            assert str(e).endswith("supported: " + ", ".join(algorithms_with("secagg")))
        assert accepted == caps(name).secagg, name


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name", NAMES)
def test_batched_fallback_reason_is_the_declared_one(name):
    """The engine's batch_clients check (engine/batched_delivery.py) on a homogeneous federation: a client
    declared not batched falls back with the declared reason; a batched one reaches the model check."""
    spec = ALGORITHMS.get(name).factory
    fed = types.SimpleNamespace(client_sources=None, client_groups=None, client_modalities=None, clients=[])

    def model(_):
        raise _Stop

    transport = types.SimpleNamespace(dp=None, attack=None, federation=fed, spec=spec, _model=model, train=None)
    if caps(name).batched:
        with pytest.raises(_Stop):
            engine_batched._blocker(transport, "train", {0: None})
    else:
        assert engine_batched._blocker(transport, "train", {0: None}) == caps(name).reason("batched")


@pytest.mark.parametrize("name", NAMES)
def test_fedavg_family_streams_as_declared(name):
    """FedAvgServer.train_accumulator reads the declared flag: a server declared not streaming
    returns None before touching anything; a streaming one goes on to build the fold."""
    server = ALGORITHMS.get(name).factory.server
    if not issubclass(server, FedAvgServer):
        assert server.train_accumulator is not FedAvgServer.train_accumulator or not caps(name).streaming
        return
    bare = object.__new__(server)
    if caps(name).streaming:
        with pytest.raises(AttributeError):  # past the check: it needs the built server's model
            bare.train_accumulator(1)
    else:
        assert bare.train_accumulator(1) is None


@pytest.mark.parametrize("name", [n for n in NAMES if ALGORITHMS.get(n).factory.server.runs_on == "single"
                                  and not ALGORITHMS.get(n).factory.pooled])
def test_stream_aggregation_on_takes_the_list_path_exactly_when_not_declared(tmp_path, capsys, name):
    experiment(config(tmp_path, "demo", f"algorithm.name={name}", "stream_aggregation=on", base=BASE, rounds=None))
    noted = "needs the whole list of replies" in capsys.readouterr().err
    assert noted == (not caps(name).streaming), name


def test_mmfl_list_shows_the_capabilities(capsys):
    assert cli_main(["list", "algorithm", "--capabilities"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in lines[1:]}
    assert own(rows) == NAMES
    assert all(rows[n] == caps(n).flags() for n in NAMES)
    assert cli_main(["list", "dataset", "--capabilities"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only algorithms declare capabilities" in err


@pytest.mark.parametrize("name", [n for n in NAMES if ALGORITHMS.get(n).factory.server.runs_on == "single"
                                  and not ALGORITHMS.get(n).factory.pooled])
def test_declared_stateful_clients_are_the_ones_leaving_state_in_the_store(tmp_path, name):
    """One round of 4 clients (tiny MLP on digits): the engine's client store holds state exactly
    when the algorithm declares stateful clients."""
    exp = run(tmp_path, "demo", f"algorithm.name={name}", "eval_every=5", base=BASE, rounds=1)
    assert (exp.transport.store.nbytes() > 0) == caps(name).stateful_clients, name
