"""FedMSplit (graph-personalized modules): the graph's equations (G1-G5 of
mmfl/algorithms/fedmsplit.py) by hand and against autograd, the learned graph finding the
clients whose blocks a client's data wants, the personalized model equal to the graph
aggregate, server state through checkpoints, and tiny end-to-end runs with resume."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms.base import ServerContext
from mmfl.algorithms.fedmsplit import (GRAPH_PREFIX, STATE_PREFIX, FedMSplitParams, FedMSplitServer,
                                       attention_matrix, edge_gradient, normalized_step)
from mmfl.algorithms.multimodal import only_held
from mmfl.config import TrainConfig
from mmfl.data.base import DatasetMeta
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment
from mmfl.errors import ConfigError
from mmfl.models.multimodal import MultimodalModel, module_of
from mmfl.report import load_metrics

from helpers import MFEAT_D as BASE, run


META = DatasetMeta("tiny", 3, {"a": (4,), "b": (3,)})


def tiny_model(seed: int = 0) -> MultimodalModel:
    torch.manual_seed(seed)
    return MultimodalModel(dict(META.modalities), META.num_classes, feat_dim=2, mlp_hidden=[5])


def msplit_server(holds, **params) -> FedMSplitServer:
    ctx = ServerContext(meta=META, train=TrainConfig(), seed=0, num_clients=len(holds), make_model=tiny_model,
                        client_modalities=holds)
    return FedMSplitServer(FedMSplitParams(**params), ctx)


def upload(server, cid, scale):
    """Client ``cid``'s reply: the global state plus a fixed perturbation, only its modules."""
    g = torch.Generator().manual_seed(100 + cid)
    state = {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
             for k, v in server.model.state_dict().items()}
    return Message(arrays=only_held(state, server.ctx.modalities_of(cid)),
                   scalars={"num_examples": 10 + cid, "train_loss": 1.0, "steps": 1})


# ============================================================================= the equations


def test_attention_matrix_by_hand():
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    bias = torch.tensor([[0.0, 0.3, -0.2], [0.1, 0.0, 0.0], [0.0, 0.0, 0.5]])
    r = 1 / math.sqrt(2)  # cos(v0, v1) = 0, cos(v0, v2) = cos(v1, v2) = 1/sqrt(2), cos(vi, vi) = 1
    cos = [[1, 0, r], [0, 1, r], [r, r, 1]]
    for b in (None, bias):
        a = attention_matrix(v, tau=0.5, bias=b)
        for i in range(3):
            e = [cos[i][j] / 0.5 + (0.0 if b is None else float(b[i, j])) for j in range(3)]  # (G1)
            z = sum(math.exp(x) for x in e)
            for j in range(3):
                assert float(a[i, j]) == pytest.approx(math.exp(e[j]) / z)  # (G2)


def test_edge_gradient_equals_autograd_and_normalized_step_by_hand():
    torch.manual_seed(0)
    nb, g = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    z = torch.randn(4, dtype=torch.float64, requires_grad=True)
    mix = 0.7
    # <g, theta~> with theta~ = (1 - mix) * const + mix * sum_j softmax(z)_j theta_j: its gradient in z is (G4)
    (mix * (torch.softmax(z, 0) @ nb) @ g).backward()
    got = edge_gradient(torch.softmax(z, 0).detach(), nb, g, mix)
    assert torch.allclose(got, z.grad, atol=1e-12)
    row = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    step = normalized_step(row, torch.tensor([0.5, -2.0, 1.0], dtype=torch.float64), lr=0.4)
    assert torch.allclose(step, torch.tensor([-0.1, 1.4, -1.2], dtype=torch.float64))  # row - 0.4 * grad / 2
    assert torch.equal(normalized_step(row, torch.zeros(3), lr=0.4), row)


# ============================================================================= the server

HOLDS = [("a", "b"), ("a", "b"), ("a",), ("a", "b")]


def test_personalized_model_is_the_graph_aggregate_by_hand():
    """mix 0.5 (cosine) and mix 1 (learned, after a graph step): what a client is sent and
    what it is evaluated with equal (G3) computed by hand over the clients holding each module."""
    for graph, mix in (("cosine", 0.5), ("learned", 1.0)):
        server = msplit_server(HOLDS, graph=graph, tau=0.2, personal_mix=mix)
        replies = {c: upload(server, c, 0.1 * (c + 1)) for c in range(3)}  # client 3 never replies
        if graph == "learned":  # some learned edge logits (G1)
            for u, b in server.edge_bias.items():
                b.copy_(torch.linspace(-1, 1, b.numel(), dtype=torch.float64).reshape(b.shape))
        server.aggregate_train(0, replies)
        glob = dict(server.model.state_dict())
        msgs = server.configure_train(1, [0, 1, 2, 3])

        def by_hand(cid, keys, peers):
            pk = [k for k in keys if k.endswith(("weight", "bias"))]
            vec = {j: torch.cat([replies[j].arrays[k].reshape(-1).double() for k in pk]) for j in peers}
            bias = server.edge_bias.get(module_of(keys[0]))  # None for the cosine graph
            e = {j: float(torch.dot(vec[cid], vec[j]) / (vec[cid].norm() * vec[j].norm())) / 0.2
                 + (0.0 if bias is None else float(bias[cid, j])) for j in peers}
            z = sum(math.exp(x) for x in e.values())
            w = {j: math.exp(e[j]) / z for j in peers}
            return {k: (1 - mix) * glob[k].double() + mix * sum(w[j] * replies[j].arrays[k].double() for j in peers)
                    for k in keys}

        enc_a = [k for k in glob if k.startswith("encoders.a.")]
        enc_b = [k for k in glob if k.startswith("encoders.b.")]
        for cid in (0, 1, 2):
            model = server.model_of(cid)  # the evaluated personalized model
            for k, v in by_hand(cid, enc_a, [0, 1, 2]).items():  # encoders.a: all three hold it
                assert torch.allclose(msgs[cid].arrays[k].double(), v, atol=1e-6), (graph, cid, k)
                assert torch.allclose(model.state_dict()[k].double(), v, atol=1e-6), (graph, cid, k)
        for cid in (0, 1):
            for k, v in by_hand(cid, enc_b, [0, 1]).items():  # encoders.b: only clients 0 and 1
                assert torch.allclose(msgs[cid].arrays[k].double(), v, atol=1e-6), (graph, cid, k)
        assert not any(k.startswith(("encoders.b.", "proj.b.", "heads.b.")) for k in msgs[2].arrays)
        for k, v in msgs[3].arrays.items():  # never seen: the global model
            assert torch.equal(v, glob[k]), k
        assert set(msgs[3].arrays) == set(glob)
        # the global model is MFedAvg's module-wise weighted average
        w = {0: 10.0, 1: 11.0, 2: 12.0}
        avg = sum(w[c] * replies[c].arrays[enc_a[0]].double() for c in w) / sum(w.values())
        assert torch.allclose(glob[enc_a[0]].double(), avg, atol=1e-6)


def test_learned_graph_puts_weight_on_the_group_the_client_data_wants():
    """Six clients in two groups, all blocks about equally far apart (the cosine start cannot
    tell the groups). Each client's training moves its block towards its own group's mean
    (its pseudo-gradient points there); the learned edges must then weigh its group more
    than the cosine start and than uniform weights, more every round."""
    holds = [("a", "b")] * 6
    group = [0, 0, 0, 1, 1, 1]
    server = msplit_server(holds, graph="learned", tau=1.0, graph_lr=0.5)
    server.aggregate_train(0, {c: upload(server, c, 0.5) for c in range(6)})  # fixed blocks from here on
    target = {gr: {k: torch.stack([server.uploads[c][k] for c in range(6) if group[c] == gr]).mean(0)
                   for k in server.uploads[0] if server.uploads[0][k].is_floating_point()} for gr in (0, 1)}

    def same_group_weight(a, cids):
        """Mean over clients of the share of their weight on others that goes to their own group."""
        shares = []
        for i, ci in enumerate(cids):
            others = [j for j, cj in enumerate(cids) if cj != ci]
            same = [j for j in others if group[cids[j]] == group[ci]]
            shares.append(float(a[i, same].sum() / a[i, others].sum()))
        return sum(shares) / len(shares)

    u = "classifier"
    cids, a0, vec = server.graph(u)
    start = same_group_weight(a0, cids)
    assert start == pytest.approx(same_group_weight(attention_matrix(vec, 1.0), cids))  # b = 0: the cosine graph
    assert start == pytest.approx(2 / 5, abs=0.05)  # ~ uniform: 2 of the 5 others are in the group
    history = [start]
    for rnd in range(1, 6):
        msgs = server.configure_train(rnd, list(range(6)))
        replies = {c: Message(arrays={k: (v + 0.3 * (target[group[c]][k] - v) if k in target[group[c]] else v)
                                      for k, v in m.arrays.items()}, scalars={"num_examples": 10})
                   for c, m in msgs.items()}
        assert server.learn_graph(replies) > 0
        server._round = None  # the blocks stay fixed: only the edges learn
        history.append(same_group_weight(server.graph(u)[1], cids))
    assert all(b > a for a, b in zip(history, history[1:])), history
    assert history[-1] > 0.8 > start + 0.35, history  # from ~0.4 (uniform, cosine) to most of the weight on others


def test_learned_graph_with_zero_step_is_the_cosine_graph_and_mix_zero_is_mfedavg():
    learned = msplit_server(HOLDS, graph="learned", graph_lr=0.0, tau=0.2)
    cosine = msplit_server(HOLDS, graph="cosine", tau=0.2, personal_mix=1.0)
    for rnd in range(3):
        a, b = learned.configure_train(rnd, [0, 1, 2, 3]), cosine.configure_train(rnd, [0, 1, 2, 3])
        for c in a:
            assert all(torch.equal(a[c].arrays[k], b[c].arrays[k]) for k in a[c].arrays), (rnd, c)
        replies = {c: upload(learned, c, 0.1 * (c + rnd + 1)) for c in range(3)}
        learned.aggregate_train(rnd, replies), cosine.aggregate_train(rnd, replies)
    plain = msplit_server(HOLDS, personal_mix=0.0)  # everyone gets the global model (MFedAvg)
    plain.load_state_dict(learned.state_dict())
    glob = dict(plain.model.state_dict())
    for c, msg in plain.configure_train(3, [0, 1, 2]).items():
        assert all(torch.equal(v, glob[k]) for k, v in msg.arrays.items()), c


def test_msplit_state_and_learned_edges_survive_dropouts_and_checkpoints():
    server = msplit_server(HOLDS, tau=0.1)
    first = {c: upload(server, c, 0.1) for c in range(3)}
    server.aggregate_train(0, first)
    server.configure_train(1, [0, 1, 2])
    server.aggregate_train(1, {1: upload(server, 1, 0.3)})  # 0 and 2 did not reply: they keep their modules
    for c in (0, 2):
        assert server.uploads[c].keys() == first[c].arrays.keys()
        assert all(torch.equal(server.uploads[c][k], v) for k, v in first[c].arrays.items()), c
    assert float(server.edge_bias["classifier"][1].abs().sum()) > 0  # client 1's edges learned
    assert float(server.edge_bias["classifier"][0].abs().sum()) == 0  # client 0 did not reply
    sd = server.state_dict()
    assert any(k.startswith(f"{STATE_PREFIX}2/") for k in sd) and f"{GRAPH_PREFIX}classifier" in sd
    twin = msplit_server(HOLDS, tau=0.1)
    twin.load_state_dict(sd)
    assert twin.uploads.keys() == server.uploads.keys()
    for u, b in server.edge_bias.items():
        assert torch.equal(twin.edge_bias[u], b), u
    a, b = server.configure_train(2, [0, 1, 2, 3]), twin.configure_train(2, [0, 1, 2, 3])
    for c in a:
        assert a[c].arrays.keys() == b[c].arrays.keys()
        assert all(torch.equal(a[c].arrays[k], b[c].arrays[k]) for k in a[c].arrays), c


def test_config_errors_name_the_field():
    for bad, field in (({"tau": 0.0}, "tau"), ({"personal_mix": 1.5}, "personal_mix"),
                       ({"graph": "gat"}, "graph"), ({"graph_lr": -1.0}, "graph_lr"),
                       ({"graph_lr": float("inf")}, "graph_lr"), ({"tau": True}, "tau")):
        with pytest.raises(ConfigError, match=f"algorithm.{field}"):
            FedMSplitParams(**bad)


# ============================================================================= end to end

# mfeat views pix + fou, 4 clients, FedCMI's case D (Dirichlet + half the clients unimodal).
def run_exp(tmp_path, name, *over, rounds=2, resume=False) -> Experiment:
    return run(tmp_path, name, *over, base=BASE, rounds=rounds, resume=resume)


def test_fedmsplit_end_to_end_personalized_evaluation_and_resume(tmp_path):
    over = ["algorithm.name=fedmsplit", 'train.lr_schedule="constant"']  # extended on resume: no cosine period
    full = run_exp(tmp_path, "full", *over, rounds=3)
    rows = load_metrics(full.run_dir)
    assert len(rows) == 3
    for r in rows:
        for key in ("accuracy", "uar", "global/accuracy", "global/accuracy/pix", "global/accuracy/fou",
                    "global/personal_accuracy", "train_loss"):
            assert math.isfinite(r[key]), key
        assert len(r["client_accuracy"]) == 4
        assert r["accuracy"] == pytest.approx(sum(r["client_accuracy"]) / 4)  # every client has test rows
    assert rows[-1]["msplit_bias_abs"] > 0 and "msplit_self_weight" in rows[-1]
    run_exp(tmp_path, "split", *over, rounds=2)
    resumed = run_exp(tmp_path, "split", *over, rounds=3, resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rs]  # noqa: E731
    assert strip(rows) == strip(load_metrics(resumed.run_dir))
    a, b = full.server.state_dict(), resumed.server.state_dict()
    assert a.keys() == b.keys() and any(k.startswith(STATE_PREFIX) for k in a)
    assert any(k.startswith(GRAPH_PREFIX) and float(v.abs().sum()) > 0 for k, v in a.items())
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_fedmsplit_cosine_keeps_the_earlier_training(tmp_path):
    """The preset trains as the earlier cosine FedMSplit: same messages as graph = cosine, mix 0.5."""
    a = load_metrics(run_exp(tmp_path, "preset", "algorithm.name=fedmsplit_cosine").run_dir)
    b = load_metrics(run_exp(tmp_path, "named", "algorithm.name=fedmsplit", 'algorithm.graph="cosine"',
                             "algorithm.personal_mix=0.5").run_dir)
    assert [r["global/accuracy"] for r in a] == [r["global/accuracy"] for r in b]
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]
    assert "msplit_bias_abs" not in a[-1]
