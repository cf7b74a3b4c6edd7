"""FedDyn (mmfl/algorithms/feddyn.py): the regularizer and its gradient on hand numbers, the
server's lines 9-10 on hand numbers, each client's g_k after its round (line 7), batched
training equal to sequential (g_k per client rides in the extras), and a resumed run
continuing h and every g_k bit-exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from mmfl.algorithms.base import ClientContext, ServerContext
from mmfl.algorithms.feddyn import GRAD, FedDynClient, FedDynParams, FedDynServer, dyn_penalty, server_step
from mmfl.config import TrainConfig, load_config
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.state import read
from mmfl.errors import ConfigError

from helpers import DIGITS, run as run_digits

BASE = [*DIGITS, "algorithm.name=feddyn", "algorithm.alpha=0.1"]


def run(tmp_path, name, *overrides, rounds=2, resume=False):
    return run_digits(tmp_path, name, *overrides, base=BASE, rounds=rounds, resume=resume)


def test_regularizer_and_its_gradient_hand_numbers():
    theta = torch.tensor([1.0, 3.0], requires_grad=True)
    anchor, g = torch.tensor([0.0, 1.0]), torch.tensor([2.0, -1.0])
    value = dyn_penalty({"w": theta}, {"w": anchor}, {"w": g}, alpha=0.5)
    # -<g, theta> + 0.5/2 ||theta - anchor||^2 = -(2 - 3) + 0.25 (1 + 4) = 2.25
    assert float(value.detach()) == pytest.approx(2.25)
    value.backward()  # -g + alpha (theta - anchor) = [-2 + 0.5, 1 + 1]
    assert torch.allclose(theta.grad, torch.tensor([-1.5, 2.0]))
    assert float(dyn_penalty({"w": theta}, {"w": anchor}, {}, alpha=0.5).detach()) == pytest.approx(1.25)  # g_k = 0


def test_server_lines_9_and_10_hand_numbers():
    prev = {"w": torch.tensor([1.0])}
    replies = [{"w": torch.tensor([3.0])}, {"w": torch.tensor([5.0])}]
    mean = {"w": torch.tensor([4.0])}
    out, h = server_step(mean, prev, replies, {}, alpha=0.5, m=4, names=["w"])
    # h = 0 - 0.5/4 (2 + 4) = -0.75;  theta = 4 - (-0.75)/0.5 = 5.5
    assert torch.allclose(h["w"], torch.tensor([-0.75])) and torch.allclose(out["w"], torch.tensor([5.5]))


def test_a_real_round_satisfies_lines_7_9_and_10(tmp_path):
    """Round 1 with every client: line 7 gives g_k = -alpha (theta_k - theta^0), so
    theta_k = theta^0 - g_k / alpha; line 9 gives h = mean_k g_k (m = |P| = 3); line 10 gives
    theta^1 = mean_k theta_k - h / alpha = theta^0 - 2 mean_k g_k / alpha."""
    exp = run(tmp_path, "one", rounds=1)
    theta0 = exp.make_model().state_dict()
    g = [read(exp.store.load(cid), GRAD) for cid in range(3)]
    names = {n for n, _ in exp.make_model().named_parameters()}
    assert all(set(gk) == names for gk in g)
    for n in names:
        g_mean = sum(gk[n] for gk in g) / 3
        assert float(g_mean.abs().max()) > 0
        assert torch.allclose(exp.server.h[n], g_mean, rtol=0, atol=1e-6)
        assert torch.allclose(exp.server.model.state_dict()[n], theta0[n] - 2 * g_mean / 0.1, rtol=0, atol=1e-5)


def test_batched_equals_sequential(tmp_path):
    seq = run(tmp_path, "seq", "batch_clients=false")
    bat = run(tmp_path, "bat", "batch_clients=true")
    rows = [json.loads(x) for x in (bat.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1].get("batched_clients") == 3 and "batched_fallback" not in rows[-1]
    for k, t in seq.server.model.state_dict().items():
        assert torch.allclose(t, bat.server.model.state_dict()[k], rtol=0, atol=1e-5), k
    for cid in range(3):
        gs, gb = read(seq.store.load(cid), GRAD), read(bat.store.load(cid), GRAD)
        assert all(torch.allclose(gs[n], gb[n], rtol=0, atol=1e-5) for n in gs)


def test_resume_continues_h_and_every_g_bit_exactly(tmp_path):
    full = run(tmp_path, "full", rounds=3)
    run(tmp_path, "half", rounds=2)
    half = run(tmp_path, "half", rounds=3, resume=True)
    for k, t in full.server.model.state_dict().items():
        assert torch.equal(t, half.server.model.state_dict()[k]), k
    assert all(torch.equal(full.server.h[n], half.server.h[n]) for n in full.server.h)


def test_bad_alpha_names_the_field():
    with pytest.raises(ConfigError, match="algorithm.alpha"):
        load_config(None, ["algorithm.name=feddyn", "algorithm.alpha=0"])


# ----------------------------------------------------------------------------- the fixed point on quadratics

D = 3
QUAD = DatasetMeta(name="quadratic", num_classes=D, modalities={"x": (D,)})
A = [np.array([0.0, 1.0, -2.0]), np.array([1.0, -1.0, 3.0])]  # client minima a_i
H = [np.array([1.0, 2.0, 0.5]), np.array([4.0, 0.5, 3.0])]  # client curvatures h_i


class QuadPoint(nn.Module):
    """One parameter vector w [D]; ``quad`` = f_i per row, 1/2 sum_d h_d (w_d - x_d)^2."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(D, dtype=torch.float64))

    def forward(self, inputs):
        return {"logits": self.w.expand(inputs["x"].shape[0], D),
                "quad": 0.5 * (inputs["h"] * (self.w - inputs["x"]) ** 2).sum(1)}


class QuadFedDyn(FedDynClient):
    def objective(self, out, labels, ref, reduction="mean"):  # L_k: the quadratic (FedDyn's own penalty on top)
        return out["quad"].mean() if reduction == "mean" else out["quad"]


def test_feddyn_fixed_point_is_the_global_minimum_where_local_minima_differ():
    """FedDyn's claim (Acar et al. sect. 3): with full participation the server model converges to a
    stationary point of the global loss even though each client's local problem has its own minimum;
    the linear term -<g_k, theta> (line 6) cancels the client drift, the server's h (lines 9-10) the
    mean. Without either the fixed point stays 0.6 away (measured with the linear term dropped)."""
    train = TrainConfig(optimizer="sgd", local_epochs=10, batch_size=2, lr=0.1, momentum=0.0, weight_decay=0.0)
    params = FedDynParams(alpha=1.0)
    server = FedDynServer(params, ServerContext(meta=QUAD, train=train, seed=0, num_clients=2, make_model=QuadPoint))
    pool, states = {}, [{}, {}]
    datas = [ArrayDataset({"x": torch.tensor(np.stack([a + 0.5, a - 0.5])), "h": torch.tensor(np.stack([h, h]))},
                          torch.zeros(2, dtype=torch.long)) for a, h in zip(A, H)]
    for rnd in range(60):
        replies = {}
        for cid, msg in server.configure_train(rnd, [0, 1]).items():
            ctx = ClientContext(cid=cid, rnd=rnd, seed=cid, data=datas[cid], test_data=None, meta=QUAD, train=train,
                                state=states[cid], model_pool=lambda key: pool.setdefault(key, QuadPoint()))
            replies[cid] = QuadFedDyn(params, ctx).handle("train", msg)
        server.aggregate_train(rnd, replies)
    w_star = (H[0] * A[0] + H[1] * A[1]) / (H[0] + H[1])  # the minimum of (f_1 + f_2) / 2
    assert np.allclose(server.model.w.detach().numpy(), w_star, rtol=0, atol=1e-8)
    # g_k converges to the client's gradient at the optimum, h to their mean (0)
    for cid in range(2):
        assert np.allclose(read(states[cid], GRAD)["w"].numpy(), H[cid] * (w_star - A[cid]), atol=1e-7)
    assert np.allclose(server.h["w"].numpy(), 0.0, atol=1e-7)
