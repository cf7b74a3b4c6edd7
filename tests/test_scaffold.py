"""SCAFFOLD's mechanism on quadratics where everything is computable by hand: the exact
update (Alg. 1 lines 10, 12, 16, 17) step by step, the fixed point at the global minimum
where FedAvg drifts, the control variates converging to the clients' gradients there; the
two correction conventions; batched = sequential for the old convention."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mmfl.algorithms.base import ClientContext, ServerContext
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgServer
from mmfl.algorithms.scaffold import (C, DC, ScaffoldClient, ScaffoldParams, ScaffoldServer, effective_steps,
                                     server_variate_update)
from mmfl.config import TrainConfig, load_config
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.errors import ConfigError

from helpers import run

sys.path.insert(0, str(Path(__file__).parent))
from data_fixtures import write_mnist_dir  # noqa: E402

D = 3
META = DatasetMeta(name="quadratic", num_classes=D, modalities={"x": (D,)})


class Point(nn.Module):
    """A model that is one parameter vector w [D] (the "logits" are w for every row)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(D, dtype=torch.float64))

    def forward(self, inputs):
        return {"logits": self.w.expand(inputs["x"].shape[0], D)}


def quadratic_loss(model, inputs, labels):
    """f_i(w) = 1/2 mean_j sum_d h_jd (w_d - x_jd)^2; over a client's rows: grad = h_i (w - a_i)."""
    return 0.5 * (inputs["h"] * (model.w - inputs["x"]) ** 2).sum(1).mean()


class QuadScaffold(ScaffoldClient):
    def loss_fn(self, global_arrays):
        return quadratic_loss


class QuadFedAvg(FedAvgClient):
    def loss_fn(self, global_arrays):
        return quadratic_loss


def client_data(a: np.ndarray, h: np.ndarray, rows: int = 2) -> ArrayDataset:
    """``rows`` (even) rows a +- 0.5 with curvature h: the full batch's gradient is h (w - a)."""
    x = torch.tensor(np.stack([a + 0.5, a - 0.5] * (rows // 2)))
    hh = torch.tensor(np.stack([h] * rows))
    return ArrayDataset({"x": x, "h": hh}, torch.zeros(rows, dtype=torch.long))


def run_rounds(client_cls, server_cls, params, a, h, train: TrainConfig, rounds: int, x0=None, rows=None):
    """Drive server and clients by hand (full participation); returns the server and the client states."""
    pool: dict[str, nn.Module] = {}
    model_pool = lambda key: pool.setdefault(key, Point())  # noqa: E731
    server = server_cls(params, ServerContext(meta=META, train=train, seed=0, num_clients=len(a),
                                              make_model=Point))
    if x0 is not None:
        with torch.no_grad():
            server.model.w.copy_(torch.tensor(x0))
    states = [{} for _ in a]
    datas = [client_data(ai, hi, r) for ai, hi, r in zip(a, h, rows or [2] * len(a))]
    for rnd in range(rounds):
        msgs = server.configure_train(rnd, list(range(len(a))))
        replies = {}
        for cid, msg in msgs.items():
            ctx = ClientContext(cid=cid, rnd=rnd, seed=cid, data=datas[cid], test_data=None, meta=META,
                                train=train, state=states[cid], model_pool=model_pool)
            replies[cid] = client_cls(params, ctx).handle("train", msg)
        server.aggregate_train(rnd, replies)
    return server, states


def hand_scaffold(a, h, x, train: TrainConfig, rounds: int, k_eff: float | None = None):
    """SCAFFOLD Alg. 1 in float64 numpy, one client step at a time, with torch.optim.SGD's
    momentum and weight decay on the corrected gradient (correction = "gradient"); option II
    divides by ``k_eff`` instead of K when given."""
    n = len(a)
    c, c_i = np.zeros(D), [np.zeros(D) for _ in range(n)]
    lr, m, wd, k = train.lr, train.momentum, train.weight_decay, train.local_epochs
    for _ in range(rounds):
        ys, dcs = [], []
        for i in range(n):
            y, buf = x.copy(), None
            for t in range(k):  # line 10: y <- y - lr (g_i(y) - c_i + c), through SGD's momentum / wd
                d = h[i] * (y - a[i]) - c_i[i] + c + wd * y
                buf = d if buf is None else m * buf + d
                y = y - lr * buf
            new = c_i[i] - c + (x - y) / ((k_eff or k) * lr)  # line 12, option II
            dcs.append(new - c_i[i])
            c_i[i] = new
            ys.append(y)
        x = np.mean(ys, axis=0)  # line 16 (equal data sizes: weighted = uniform)
        c = c + np.sum(dcs, axis=0) / n  # line 17
    return x, c, c_i


A = [np.array([0.0, 1.0, -2.0]), np.array([1.0, -1.0, 3.0])]
H = [np.array([1.0, 2.0, 0.5]), np.array([4.0, 0.5, 3.0])]


@pytest.mark.parametrize("momentum,wd,option2", [(0.0, 0.0, "printed"), (0.0, 0.0, "momentum"),
                                                 (0.9, 1e-2, "printed"), (0.9, 1e-2, "momentum")])
def test_scaffold_exact_update_equals_algorithm_one_by_hand_on_a_quadratic(momentum, wd, option2):
    train = TrainConfig(optimizer="sgd", local_epochs=5, batch_size=2, lr=0.1, momentum=momentum, weight_decay=wd)
    x0 = np.array([0.3, -0.2, 0.1])
    server, states = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams(option2=option2), A, H, train, 3, x0)
    k_eff = effective_steps(5, momentum) if option2 == "momentum" else None
    x, c, c_i = hand_scaffold(A, H, x0, train, 3, k_eff)
    assert np.allclose(server.model.w.detach().numpy(), x, atol=1e-10)
    assert np.allclose(server.c["w"].numpy(), c, atol=1e-10)
    for i in range(2):
        assert np.allclose(states[i][C + "w"].numpy(), c_i[i], atol=1e-10)
    assert np.abs(c).max() > 0.01  # the variates are not trivially zero


def test_scaffold_after_step_equals_gradient_convention_for_plain_sgd():
    train = TrainConfig(optimizer="sgd", local_epochs=5, batch_size=2, lr=0.1, momentum=0.0, weight_decay=0.0)
    g, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams("gradient"), A, H, train, 4)
    s, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams("after_step"), A, H, train, 4)
    assert torch.allclose(g.model.w, s.model.w, atol=1e-12)
    # with momentum they differ: "gradient" sends the correction through the momentum buffer
    train_m = TrainConfig(optimizer="sgd", local_epochs=5, batch_size=2, lr=0.02, momentum=0.9, weight_decay=0.0)
    g, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams("gradient"), A, H, train_m, 2)
    s, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams("after_step"), A, H, train_m, 2)
    assert float((g.model.w - s.model.w).detach().abs().max()) > 1e-3


def test_scaffold_fixed_point_is_the_global_minimum_while_fedavg_drifts():
    # f = (f_1 + f_2) / 2 with f_i = 1/2 sum_d h_id (w_d - a_id)^2: minimum sum_i h_i a_i / sum_i h_i
    train = TrainConfig(optimizer="sgd", local_epochs=10, batch_size=2, lr=0.1, momentum=0.0, weight_decay=0.0)
    w_star = (H[0] * A[0] + H[1] * A[1]) / (H[0] + H[1])
    avg, _ = run_rounds(QuadFedAvg, FedAvgServer, None, A, H, train, 80)
    sca, states = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams(), A, H, train, 80)
    # FedAvg's fixed point by hand: sum_i (1 - r_i^K) a_i / sum_i (1 - r_i^K), r_i = 1 - lr h_i
    q = [1 - (1 - train.lr * h) ** train.local_epochs for h in H]
    fedavg_fixed = (q[0] * A[0] + q[1] * A[1]) / (q[0] + q[1])
    assert np.allclose(avg.model.w.detach().numpy(), fedavg_fixed, atol=1e-8)
    assert np.abs(fedavg_fixed - w_star).max() > 0.2  # the drift is real
    assert np.allclose(sca.model.w.detach().numpy(), w_star, atol=1e-8)
    # the control variates converge to the clients' gradients at the optimum, c to their mean (0)
    for i in range(2):
        assert np.allclose(states[i][C + "w"].numpy(), H[i] * (w_star - A[i]), atol=1e-7)
    assert np.allclose(sca.c["w"].numpy(), 0.0, atol=1e-7)


def test_effective_steps_hand_values():
    assert effective_steps(7, 0.0) == 7.0
    assert effective_steps(1, 0.9) == pytest.approx(1.0)
    assert effective_steps(2, 0.9) == pytest.approx(1 + 1.9)
    assert effective_steps(3, 0.9) == pytest.approx(1 + 1.9 + 2.71)
    # many steps: K / (1 - m) minus the buffer's warm-up m / (1 - m)^2
    assert effective_steps(100, 0.5) == pytest.approx(200 - 2 * (1 - 0.5 ** 100))


def test_server_variate_update_uniform_and_weighted_hand_values():
    c = {"w": torch.tensor([1.0])}
    dcs = [{"w": torch.tensor([2.0])}, {"w": torch.tensor([6.0])}]
    # |S| = 2 of N = 4: c + (2 + 6) / 4 = 3;  weighted 1:3: c + 2/4 * (0.25 * 2 + 0.75 * 6) = 3.5
    assert float(server_variate_update(c, dcs, 4)["w"]) == pytest.approx(3.0)
    assert float(server_variate_update(c, dcs, 4, [10, 30])["w"]) == pytest.approx(3.5)


def test_scaffold_with_momentum_needs_the_momentum_step_count_in_option_two():
    # with momentum 0.9 and the correction in the gradient, option II as printed over-estimates the
    # gradient by K_eff / K = 4.1 (> 2: the variates' update c_i <- c_i + 4.1 (g_i - c_i) diverges);
    # with K_eff the fixed point is the global minimum again. The old after-step convention does
    # not diverge but its fixed point is off (the momentum buffer restarts every round).
    train = TrainConfig(optimizer="sgd", local_epochs=10, batch_size=2, lr=0.02, momentum=0.9, weight_decay=0.0)
    assert effective_steps(10, 0.9) / 10 == pytest.approx(4.14, abs=0.01)
    w_star = (H[0] * A[0] + H[1] * A[1]) / (H[0] + H[1])

    def err(params, rounds):
        s, _ = run_rounds(QuadScaffold, ScaffoldServer, params, A, H, train, rounds)
        return float(np.abs(s.model.w.detach().numpy() - w_star).max())

    assert err(ScaffoldParams("gradient", "printed"), 30) > 1e3
    assert err(ScaffoldParams("gradient", "momentum"), 100) < 1e-9
    assert 0.05 < err(ScaffoldParams("after_step", "printed"), 100) < 0.3
    avg, _ = run_rounds(QuadFedAvg, FedAvgServer, None, A, H, train, 100)
    assert float(np.abs(avg.model.w.detach().numpy() - w_star).max()) > 0.3


def test_scaffold_correction_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.correction"):
        load_config(None, ["algorithm.name=scaffold", "algorithm.correction=before"])
    with pytest.raises(ConfigError, match="algorithm.correction"):
        ScaffoldParams("sideways")
    with pytest.raises(ConfigError, match="algorithm.option2"):
        ScaffoldParams(option2="nominal")
    with pytest.raises(ConfigError, match="algorithm.variate_weights"):
        ScaffoldParams(variate_weights="size")


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    write_mnist_dir(root, n_train=240, n_test=60, hw=(16, 16))
    return root


@pytest.mark.parametrize("correction", ["gradient", "after_step"])
def test_scaffold_batched_equals_sequential_for_both_conventions(tmp_path, mnist_root, correction):
    def trained(name, batched):
        return run(tmp_path, name, "algorithm.name=scaffold", f"algorithm.correction={correction}",
                   f"batch_clients={str(batched).lower()}", rounds=3, base=(
                       "data.name=mnist_idx", f"data.root={mnist_root}", "partition.name=dirichlet",
                       "partition.num_clients=4", "partition.beta=0.5", "clients_per_round=3", "model.name=simple_cnn",
                       "model.out_dim=32", "train.local_epochs=1", "train.batch_size=16", "train.optimizer=\"sgd\"",
                       "train.lr=0.05", "threads=1"))

    seq, bat = trained("seq", False), trained("bat", True)
    for a, b in [(seq.server.state_dict(), bat.server.state_dict()), (seq.store.state_dict(), bat.store.state_dict())]:
        assert a.keys() == b.keys()
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=0, atol=2e-5), k
    assert any(k.startswith(C) for k in seq.server.state_dict())
    assert not any(k.startswith(DC) for k in seq.server.state_dict())


def test_scaffold_option_one_variate_is_the_local_gradient_at_the_server_model():
    # option I: c_i+ = grad f_i(x) = h_i (x - a_i) on the quadratic, whatever the local steps did
    train = TrainConfig(optimizer="sgd", local_epochs=5, batch_size=2, lr=0.1, momentum=0.9, weight_decay=0.0)
    x0 = np.array([0.3, -0.2, 0.1])
    server, states = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams(option="I"), A, H, train, 1, x0)
    for i in range(2):
        assert np.allclose(states[i][C + "w"].numpy(), H[i] * (x0 - A[i]), atol=1e-12)
    assert np.allclose(server.c["w"].numpy(), (H[0] * (x0 - A[0]) + H[1] * (x0 - A[1])) / 2, atol=1e-12)
    # and its fixed point is the global minimum too
    w_star = (H[0] * A[0] + H[1] * A[1]) / (H[0] + H[1])
    plain = TrainConfig(optimizer="sgd", local_epochs=10, batch_size=2, lr=0.1, momentum=0.0, weight_decay=0.0)
    s, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams(option="I"), A, H, plain, 80)
    assert np.allclose(s.model.w.detach().numpy(), w_star, atol=1e-8)


def test_scaffold_variate_weights_set_which_objective_the_fixed_point_minimizes():
    # clients of 2 and 8 samples: the model average is data-weighted (0.2, 0.8). With line 17's
    # mean weighted the same way, the fixed point minimizes sum_i p_i f_i (what FedAvg's weights
    # and the pooled data ask for); with line 17 uniform as printed, it minimizes mean_i f_i,
    # whatever the model average's weights (then sum_i p_i (c - c_i) != 0 every round)
    train = TrainConfig(optimizer="sgd", local_epochs=10, batch_size=8, lr=0.1, momentum=0.0, weight_decay=0.0)
    p = np.array([0.2, 0.8])
    w_data = (p[0] * H[0] * A[0] + p[1] * H[1] * A[1]) / (p[0] * H[0] + p[1] * H[1])
    w_unif = (H[0] * A[0] + H[1] * A[1]) / (H[0] + H[1])
    assert np.abs(w_data - w_unif).max() > 0.1
    data, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams(variate_weights="data"), A, H, train, 80,
                         rows=[2, 8])
    unif, _ = run_rounds(QuadScaffold, ScaffoldServer, ScaffoldParams(variate_weights="uniform"), A, H, train, 80,
                         rows=[2, 8])
    assert np.allclose(data.model.w.detach().numpy(), w_data, atol=1e-8)
    assert np.allclose(unif.model.w.detach().numpy(), w_unif, atol=1e-8)
