"""Evaluation as a protocol (mmfl.core.evaluation): the personalized evaluation gives the
same numbers scored on the server (simulation: per-client test rows drawn by the engine) and
through the clients (message route: each client draws its own rows from its own labels and
scores the model it is sent, or its own); ``run.personal_eval`` adds it to any algorithm
without changing its other metrics; FedFomo / FedMSplit / pFedWireless run on Flower."""

from __future__ import annotations

import dataclasses

import pytest

from mmfl.core import evaluation
from mmfl.core.evaluation import PERSONAL_ROUTE, run_evaluations

from helpers import config, experiment, rows, run_config

BASE = ["data.name=mfeat", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1", "rounds=2"]
# two mfeat views, Dirichlet labels, 2 of the 4 clients unimodal (FedCMI's case D)
MULTIMODAL = ["data.name=mfeat", 'data.views=["pix", "fou"]', "partition.num_clients=4", 'case="D"',
              "model.name=multimodal", "model.feat_dim=8", "model.mlp_hidden=[16]",
              "train.local_epochs=1", "train.batch_size=64", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1", "rounds=2"]
PERSONAL_KEYS = ("accuracy", "accuracy_std", "uar", "test_loss", "client_accuracy", "personal_test_rows")


def cfg_of(tmp_path, name, *over, base=BASE):
    return config(tmp_path, name, *over, base=base, rounds=None)


@pytest.mark.parametrize("algo,base", [("fedfomo", MULTIMODAL), ("fedamp", BASE), ("fedmsplit", MULTIMODAL),
                                       ("pfedwireless", MULTIMODAL), ("local", BASE), ("mfedavg", MULTIMODAL)])
def test_personalized_evaluation_on_the_server_equals_the_message_route(tmp_path, algo, base):
    exp = run_config(cfg_of(tmp_path, algo, f"algorithm.name={algo}", "rounds=1", base=base))
    direct = exp.eval_context(0)
    if algo == "local":  # only the clients hold SOLO's models: both go through the clients
        assert direct.personal_rows is not None
    sent = []

    def send(route, msgs):
        sent.append((route, sorted(msgs)))
        return exp.transport.send(route, msgs)

    routed = dataclasses.replace(direct, personal_rows=None, send=send)  # nothing drawn on the server
    exp.transport.begin_round(1)
    a = exp.server.evaluate_personalized(direct)
    b = exp.server.evaluate_personalized(routed)
    assert (PERSONAL_ROUTE, list(range(exp.federation.num_clients))) in sent  # every client answered
    assert set(PERSONAL_KEYS) <= set(a)
    assert a == b  # the same rows and the same models: the same numbers, exactly
    assert len(a["client_accuracy"]) == exp.federation.num_clients
    if algo == "mfedavg":  # the default personalized model: the global model on each client's modalities
        holds = [exp.federation.modalities_of(c) for c in range(4)]
        assert len(set(holds)) > 1


@pytest.mark.parametrize("algo", ["fedamp", "local"])
def test_the_message_route_sends_a_chunk_of_clients_at_a_time_with_the_same_numbers(tmp_path, monkeypatch, algo):
    # issue 28 item 7: memory bounded by a chunk's messages (each holds a model), not the client count
    exp = run_config(cfg_of(tmp_path, algo, f"algorithm.name={algo}", "rounds=1", "partition.num_clients=5"))
    sizes = []

    def send(route, msgs):
        sizes.append(len(msgs))
        return exp.transport.send(route, msgs)

    routed = dataclasses.replace(exp.eval_context(0), personal_rows=None, send=send)
    exp.transport.begin_round(1)
    whole = exp.server.evaluate_personalized(routed)
    assert sizes == [5]
    sizes.clear()
    monkeypatch.setattr(evaluation, "PERSONAL_CHUNK", 2)
    chunked = exp.server.evaluate_personalized(routed)
    assert sizes == [2, 2, 1]
    assert chunked == whole and len(whole["client_accuracy"]) == 5


def test_personal_eval_switch_adds_personalized_metrics_and_changes_nothing_else(tmp_path):
    off = cfg_of(tmp_path, "off", "algorithm.name=fedavg")
    on = cfg_of(tmp_path, "on", "algorithm.name=fedavg", "personal_eval=true")
    run_config(off)
    run_config(on)
    r_off, r_on = rows(off.run_dir), rows(on.run_dir)
    assert not any(k.startswith("personal/") for r in r_off for k in r)
    for a, b in zip(r_off, r_on):
        extra = {k for k in b if k.startswith("personal/")}
        assert {f"personal/{k}" for k in PERSONAL_KEYS} <= extra
        assert {k: v for k, v in b.items() if k not in extra and not k.endswith("_time_s")} == \
               {k: v for k, v in a.items() if not k.endswith("_time_s")}  # global metrics unchanged
        assert 0.0 < b["personal/accuracy"] <= 1.0


def test_server_declares_its_evaluations(tmp_path):
    exp = experiment(cfg_of(tmp_path, "fomo", "algorithm.name=fedfomo"))
    assert exp.evaluations() == {"personalized": ""}
    exp = experiment(cfg_of(tmp_path, "fedmsplit", "algorithm.name=fedmsplit", base=MULTIMODAL))
    assert exp.evaluations() == {"personalized": "", "global": "global/"}
    exp = experiment(cfg_of(tmp_path, "avg", "algorithm.name=fedavg", "personal_eval=true"))
    assert exp.evaluations() == {"global": "", "personalized": "personal/"}
    with pytest.raises(NotImplementedError, match="evaluate_nothing"):
        run_evaluations(exp.server, {"nothing": ""}, exp.eval_context(0))


# ----------------------------------------------------------------------------- Flower

flwr = pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')

try:
    from test_flower import InProcessGrid
except ImportError:  # run as the package tests.*
    from tests.test_flower import InProcessGrid

from mmfl.flower.transport import FlowerTransport  # noqa: E402


def same_personal_metrics(flower: list[dict], sim: list[dict]) -> None:
    """Equal rows except the evaluation's bytes: on Flower the clients evaluate (their models
    travel down, their metrics up), in the simulation the server scores its copies."""
    assert len(flower) == len(sim)
    for f, s in zip(flower, sim):
        assert f["eval_bytes_down"] > 0 and f["eval_bytes_up"] > 0
        strip = lambda r: {k: v for k, v in r.items() if not k.endswith("_time_s") and not k.startswith("eval_bytes")}  # noqa: E731
        assert strip(f) == strip(s)


@pytest.mark.parametrize("algo", ["fedmsplit", "pfedwireless"])
def test_personalized_algorithms_run_on_the_flower_transport(tmp_path, algo):
    nodes = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}
    cfg = cfg_of(tmp_path / "grid", algo, f"algorithm.name={algo}", base=MULTIMODAL)
    grid = InProcessGrid(cfg.to_toml(), nodes)
    run_config(cfg, transport=lambda e: FlowerTransport(grid, e.federation, cfg.run,
                                                        wait_for_nodes_s=0))
    sim = cfg_of(tmp_path / "sim", algo, f"algorithm.name={algo}", base=MULTIMODAL)
    run_config(sim)
    same_personal_metrics(rows(cfg.run_dir), rows(sim.run_dir))


# FedFomo (the server's copy of each client's model sent to that client's SuperNode, which scores
# it) and FedMSplit (each SuperNode scores its client's own model) run on a real loopback deployment
# in tests/test_flower_missing.py::test_loopback_deployment_equals_simulator: one deployment for both
