"""pfedwireless (Yin, Chen, Tao): coefficients on the simplex under masking (eq. 4-5), the
coefficient gradient (eq. 6) against finite differences of the loss through the aggregation
(eq. 2) on a tiny model, Algorithm 1's schedule (lines 5-9, Table III's linear variant, A_th),
an unscheduled group keeping its parameters on both sides, and end-to-end runs with and
without [system] (finite personalized accuracy, resume = uninterrupted run)."""

from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ClientContext, ServerContext
from mmfl.algorithms.pfedwireless import PFedWirelessClient, PFedWirelessParams, PFedWirelessServer
from mmfl.algorithms.pfedwireless_math import (SHARED, aggregate_row, coefficient_gradient, flat, mask_matrix,
                                               masked_coefficients, pseudo_gradient, softmax_rows)
from mmfl.algorithms.wireless_scheduling import ranking_values, scheduled_count, select_devices
from mmfl.config import TrainConfig, load_config
from mmfl.data.base import DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models.multimodal import MultimodalParams, multimodal

from helpers import config, experiment, rows, run

MM = ["data.name=mfeat", 'data.views=["pix", "fou", "kar"]', "modalities.name=mixed", "partition.num_clients=6",
      "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[32]", "train.local_epochs=1",
      "train.batch_size=64", "train.optimizer=adam", "train.lr=0.001", "threads=1", "algorithm.name=pfedwireless"]


# ----------------------------------------------------------------------------- eq. 4-5


def test_coefficient_rows_are_on_the_simplex_under_masking():
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        k = 6
        xi_hat = torch.randn(k, k, generator=gen, dtype=torch.float64) * 2
        u = torch.rand(k, generator=gen) < 0.5
        coeff = masked_coefficients(xi_hat, u)
        assert torch.allclose(coeff.sum(1), torch.ones(k, dtype=torch.float64))
        assert (coeff >= 0).all()
        soft = softmax_rows(xi_hat)
        for r in range(k):
            if not u[r]:  # eq. 5: a device that did not upload keeps its own (row e_k) ...
                assert coeff[r].tolist() == [1.0 if c == r else 0.0 for c in range(k)]
                assert all(float(coeff[o, r]) == 0.0 for o in range(k) if o != r)  # ... and weighs in no other row
            else:  # the softmax renormalised over the uploaders
                want = torch.where(u, soft[r], torch.zeros(k, dtype=torch.float64))
                assert torch.allclose(coeff[r], want / want.sum())


def test_mask_matrix_and_initial_coefficients():
    u = torch.tensor([True, False, True])
    assert mask_matrix(u).tolist() == [[1, 0, 1], [0, 1, 0], [1, 0, 1]]
    xi = torch.full((3, 3), 1 / 3, dtype=torch.float64)  # eq. 3's initial value
    assert torch.allclose(masked_coefficients(xi, torch.ones(3, dtype=torch.bool)), torch.full((3, 3), 1 / 3,
                                                                                               dtype=torch.float64))
    assert masked_coefficients(xi, u)[0].tolist() == pytest.approx([0.5, 0.0, 0.5])


def test_aggregate_row_is_eq2():
    ups = {0: {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, 2: {"w": torch.tensor([3.0, 6.0]),
                                                                        "n": torch.tensor(5)}}
    out = aggregate_row(torch.tensor([0.25, 0.0, 0.75], dtype=torch.float64), ups)
    assert out["w"].tolist() == pytest.approx([2.5, 5.0]) and out["w"].dtype == torch.float32
    assert int(out["n"]) == 5  # integer buffers: the maximum


# ----------------------------------------------------------------------------- eq. 6-7


def _tiny_case():
    torch.manual_seed(0)
    net = nn.Linear(3, 2).double()
    x = torch.randn(16, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (16,))
    keys = ["weight", "bias"]
    uploads = {c: {"weight": torch.randn(2, 3, dtype=torch.float64), "bias": torch.randn(2, dtype=torch.float64)}
               for c in (0, 1, 3)}  # device 2 did not upload
    u = torch.tensor([True, True, False, True])
    xi_hat = torch.randn(4, 4, dtype=torch.float64)

    def loss(w):  # F_k(W): device k's loss at parameters W
        return F.cross_entropy(torch.func.functional_call(net, w, (x,)), y)

    def w_of(xh, k):  # eq. 4-5 then eq. 2
        return aggregate_row(masked_coefficients(xh, u)[k], uploads)

    return net, keys, uploads, u, xi_hat, loss, w_of


def test_coefficient_gradient_matches_finite_differences_on_a_tiny_model():
    net, keys, uploads, u, xi_hat, loss, w_of = _tiny_case()
    k = 1
    w = w_of(xi_hat, k)
    wt = {key: v.clone().requires_grad_() for key, v in w.items()}
    loss(wt).backward()
    grad_w = flat({key: wt[key].grad for key in keys}, keys)  # the exact grad_W F_k(W_k)
    coeff = masked_coefficients(xi_hat, u)[k]
    g = coefficient_gradient(coeff, {c: flat(v, keys) for c, v in uploads.items()}, flat(w, keys), grad_w)
    h = 1e-6
    for j in range(4):  # d F_k(W_k(xi^)) / d xi^_{k,j} by central differences
        e = torch.zeros_like(xi_hat)
        e[k, j] = h
        fd = (float(loss(w_of(xi_hat + e, k))) - float(loss(w_of(xi_hat - e, k)))) / (2 * h)
        assert float(g[j]) == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert float(g[2]) == 0.0  # a device that did not upload gets no gradient
    # eq. 7: a small step against the gradient lowers F_k
    step = xi_hat.clone()
    step[k] -= 1e-3 * g
    assert float(loss(w_of(step, k))) < float(loss(w))


def test_parameter_change_of_one_sgd_step_estimates_the_gradient():
    """One plain SGD step from W_k: W_k - w_k^1 = eta grad F_k(W_k), so the estimated eq. 6
    gradient is eta times the exact one (the paper's 'estimated by the change of parameters')."""
    net, keys, uploads, u, xi_hat, loss, w_of = _tiny_case()
    k, eta = 0, 0.05
    w = w_of(xi_hat, k)
    wt = {key: v.clone().requires_grad_() for key, v in w.items()}
    loss(wt).backward()
    exact = flat({key: wt[key].grad for key in keys}, keys)
    opt = torch.optim.SGD(list(wt.values()), lr=eta)
    opt.step()  # eq. 1 with N_k = 1
    est = pseudo_gradient(flat(w, keys), flat({key: v.detach() for key, v in wt.items()}, keys))
    assert torch.allclose(est, eta * exact, atol=1e-12)
    coeff = masked_coefficients(xi_hat, u)[k]
    prev = {c: flat(v, keys) for c, v in uploads.items()}
    assert torch.allclose(coefficient_gradient(coeff, prev, flat(w, keys), est),
                          eta * coefficient_gradient(coeff, prev, flat(w, keys), exact), atol=1e-12)


# ----------------------------------------------------------------------------- scheduling


def test_scheduled_count():
    assert [scheduled_count(1 / 3, 9), scheduled_count(2 / 3, 9), scheduled_count(1.0, 9)] == [3, 6, 9]
    assert scheduled_count(0.01, 9) == 1 and scheduled_count(4, 9) == 4


def test_ratio_and_linear_rankings():
    one_minus = np.array([0.9, 0.8, 0.5])
    lat = np.array([10.0, 1.0, 1.0])
    assert ranking_values(one_minus, lat, "ratio", 0).tolist() == pytest.approx([0.09, 0.8, 0.5])
    assert ranking_values(one_minus, lat, "linear", 0.01).tolist() == pytest.approx([0.8, 0.79, 0.49])
    assert ranking_values(one_minus, lat, "linear", 0.0).tolist() == pytest.approx(one_minus.tolist())


def test_select_devices_honours_a_th():
    age = torch.zeros(4, dtype=torch.int64)
    picks = []
    for _ in range(6):  # device 0 always wins; 1 and 2 wait; 3 is not eligible (does not hold the modality)
        chosen, forced, age = select_devices([3.0, 2.0, 1.0], [0, 1, 2], 1, age, a_th=3)
        picks.append((chosen, forced))
    assert picks == [([0], []), ([0], []), ([0, 1, 2], [1, 2])] * 2
    assert int(age[3]) == 0
    chosen, forced, age = select_devices([1.0, 1.0, 1.0], [4, 2, 3], 2, torch.zeros(5, dtype=torch.int64), a_th=0)
    assert chosen == [2, 3] and forced == [] and age.tolist() == [0, 0, 0, 0, 1]  # ties: lower id; 0 = never force


META = DatasetMeta("t", 3, {"a": (4,), "b": (5,)})
HOLDS = [("a", "b"), ("a", "b"), ("a",), ("a",), ("b",), ("b",)]


class FakeSystem:
    """Latencies from a fixed rate (bit/s) and compute time per device; records upload queries."""

    def __init__(self, rate, cmp):
        self.rate, self.cmp, self.uploads = rate, cmp, []

    def download_latency(self, rnd, cid, nbytes):
        return 8 * nbytes / self.rate[cid]

    def upload_latency(self, rnd, cid, nbytes):
        self.uploads.append((cid, nbytes))
        return 8 * nbytes / self.rate[cid]

    def compute_latency(self, cid):
        return self.cmp[cid]


def make_server(system=None, **params):
    ctx = ServerContext(meta=META, train=TrainConfig(), seed=0, num_clients=len(HOLDS),
                        make_model=lambda: multimodal(MultimodalParams(feat_dim=4, mlp_hidden=[4]), META),
                        client_modalities=HOLDS, system=system)
    return PFedWirelessServer(PFedWirelessParams(**params), ctx)


def _set_self(srv, group, diag):
    """Xi^m with the given diagonal and zeros elsewhere (so xi~_kk = e^d / (e^d + K - 1))."""
    xi = torch.zeros(6, 6, dtype=torch.float64)
    xi[range(6), range(6)] = torch.tensor(diag, dtype=torch.float64)
    srv.xi[group] = xi


def test_schedule_without_system_ranks_by_one_minus_self_coefficient():
    srv = make_server(k_hat=2, a_th=0)
    assert srv.groups == ["a", "b", SHARED]
    _set_self(srv, "a", [3.0, 0.0, 1.0, -1.0, 0.0, 0.0])  # holders of a: 0-3; smallest self weight: 3, then 1
    _set_self(srv, "b", [0.0, 2.0, 0.0, 0.0, 1.0, -2.0])  # holders of b: 0, 1, 4, 5 -> 5, then 0
    _set_self(srv, SHARED, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # all tied -> the lowest ids
    sched, forced = srv.schedule(0, list(range(6)), {c: 0 for c in range(6)})
    assert sched == {"a": [1, 3], "b": [0, 5], SHARED: [0, 1]} and all(not v for v in forced.values())
    # a cohort without device 3 and 5: the next ones, among the round's devices only
    sched, _ = srv.schedule(1, [0, 1, 2, 4], {c: 0 for c in range(6)})
    assert sched["a"] == [1, 2] and sched["b"] == [0, 4]


def test_schedule_with_system_uses_latency_and_the_groups_already_scheduled():
    rate = [1e6, 1e6, 1e6, 1e3, 1e6, 1e6]  # device 3 has a slow channel
    fake = FakeSystem(rate, [0.5] * 6)
    srv = make_server(system=fake, k_hat=2, a_th=0)
    _set_self(srv, "a", [3.0, 0.0, 1.0, -1.0, 0.0, 0.0])  # without latency: 3 and 1 (previous test)
    down = {c: 1000 * c for c in range(6)}
    sched, _ = srv.schedule(0, list(range(6)), down)
    soft = softmax_rows(srv.xi["a"])
    y = srv.group_bytes
    lat = {c: 8 * down[c] / rate[c] + 0.5 + 8 * y["a"] / rate[c] for c in range(4)}
    val = {c: (1 - float(soft[c, c])) / lat[c] for c in range(4)}
    assert sched["a"] == sorted(sorted(val, key=lambda c: (-val[c], c))[:2]) == [1, 2]  # 3 is too slow now
    # the shared group's upload term counts the groups already scheduled for that device (line 6)
    shared_calls = fake.uploads[-6:]
    for c, nbytes in shared_calls:
        before = sum(y[g] for g in ("a", "b") if c in sched[g])
        assert nbytes == before + y[SHARED]
    # the linear variant (Table III) with a huge alpha picks the fastest devices
    fast = make_server(system=FakeSystem(rate, [0.5, 0.1, 0.9, 0.5, 0.5, 0.5]), k_hat=0.1, a_th=0,
                       schedule="linear", alpha=1e3)
    assert fast.schedule(0, list(range(6)), {c: 0 for c in range(6)})[0]["a"] == [1]


def test_server_schedule_forces_devices_after_a_th_rounds():
    srv = make_server(k_hat=0.1, a_th=2)  # round(0.1 * 6) = 1 device per group
    _set_self(srv, "a", [-3.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # device 0 always first for a
    rounds = [srv.schedule(r, list(range(6)), {c: 0 for c in range(6)}) for r in range(4)]
    assert [s["a"] for s, _ in rounds] == [[0], [0, 1, 2, 3], [0], [0, 1, 2, 3]]
    assert [f["a"] for _, f in rounds] == [[], [1, 2, 3], [], [1, 2, 3]]


# ----------------------------------------------------------------------------- the protocol


def _spy(exp):
    """Capture each round's schedule and each route's messages."""
    srv, tr = exp.server, exp.transport
    seen = {"sched": {}, "msgs": {}}
    schedule, send = srv.schedule, tr.send

    def sched_spy(rnd, *a):
        out = schedule(rnd, *a)
        seen["sched"][rnd] = out[0]
        return out

    def send_spy(route, msgs):
        seen["msgs"][(tr.rnd, route)] = msgs
        return send(route, msgs)

    srv.schedule, tr.send = sched_spy, send_spy
    return seen


def test_unscheduled_group_keeps_its_parameters_on_both_sides(tmp_path):
    cfg = config(tmp_path, "keep", "algorithm.k_hat=0.2", "algorithm.a_th=0", base=MM, rounds=None)
    exp = experiment(cfg)
    srv, tr, fed = exp.server, exp.transport, exp.federation
    seen = _spy(exp)
    cohort = list(range(fed.num_clients))
    w0 = {c: dict(srv.w[c]) for c in cohort}
    tr.begin_round(0)
    srv.round(0, cohort, tr)
    sched = seen["sched"][0]
    assert all(len(v) == 1 for v in sched.values())  # round(0.2 * 6) = 1 device per group
    states = {c: exp.store.load(c) for c in cohort}
    for c in cohort:
        for g in srv.groups_of(c):
            keys = srv.param_keys[g]
            if c in sched[g]:  # the only uploader: W_k = its own upload (coefficient 1)
                assert all(torch.equal(srv.w[c][k], states[c]["model/" + k]) for k in keys)
            else:  # the server's W_k unchanged (sec. II-B2), the device kept its trained parameters
                assert all(torch.equal(srv.w[c][k], w0[c][k]) for k in keys)
                assert any(not torch.equal(states[c]["model/" + k], w0[c][k]) for k in keys)
        # the reply carried only the scheduled groups
    # round 1: only the groups aggregated for a device travel down, and the device starts from them
    tr.begin_round(1)
    srv.round(1, cohort, tr)
    for c in cohort:
        msg = seen["msgs"][(1, "train")][c]
        for g in srv.groups_of(c):
            sent = [k for k in srv.group_keys[g] if k in msg.arrays]
            assert bool(sent) == (c in sched[g])
        holds = fed.modalities_of(c)
        model = exp.make_model(holds)
        ctx = ClientContext(cid=c, rnd=1, seed=0, data=fed.clients[c], test_data=None, meta=fed.meta,
                            train=cfg.train, state=dict(states[c]), model_pool=lambda key: model,
                            init_model=lambda: exp.make_model(holds), modalities=holds)
        start = PFedWirelessClient(cfg.algorithm.params, ctx).load_model(msg).state_dict()
        for k, v in start.items():
            want = msg.arrays[k] if k in msg.arrays else states[c]["model/" + k]
            assert torch.equal(v, want), (c, k)


def test_coefficients_update_only_for_rows_that_uploaded_twice(tmp_path):
    exp = experiment(config(tmp_path, "rows", "algorithm.k_hat=0.5", "algorithm.a_th=0", "algorithm.eta_hat=10",
                            base=MM, rounds=None))
    srv, tr = exp.server, exp.transport
    seen = _spy(exp)
    cohort = list(range(6))
    for r in range(3):
        before = {g: srv.xi[g].clone() for g in srv.groups}
        tr.begin_round(r)
        srv.round(r, cohort, tr)
        for g in srv.groups:
            changed = {c for c in range(6) if not torch.equal(before[g][c], srv.xi[g][c])}
            both = set(seen["sched"][r][g]) & (set(seen["sched"][r - 1][g]) if r else set())
            assert changed <= both
            if r == 0:
                assert not changed
    assert any(not torch.equal(srv.xi[g], torch.full((6, 6), 1 / 6, dtype=torch.float64)) for g in srv.groups)


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("extra", [[], ["system.name=wireless"],
                                   ["system.name=wireless", "algorithm.schedule=linear", "algorithm.alpha=0.01",
                                    "algorithm.eval_model=server", "algorithm.probe=true"]])
def test_end_to_end_finishes_with_finite_personalized_accuracy(tmp_path, extra):
    cfg = config(tmp_path, "e2e", "algorithm.a_th=2", *extra, base=MM, rounds=3)
    exp = experiment(cfg)
    summary = exp.run()
    got = rows(exp)
    assert np.isfinite(summary["final_accuracy"]) and 0 <= summary["final_accuracy"] <= 1
    for r in got:
        assert np.isfinite(r["accuracy"]) and np.isfinite(r["uar"])
        assert len(r["client_accuracy"]) == 6 and r["uploads"] >= 1
        assert ("sim_time_s" in r) == bool(extra)
    assert got[0]["xi_rows_updated"] == 0 and got[0]["bytes_down"] < 1000  # round 1: only the schedule goes down
    assert got[1]["bytes_down"] > 1000  # then the aggregated groups
    # the checkpointed state round-trips
    sd = exp.server.state_dict()
    fresh = PFedWirelessServer(cfg.algorithm.params, exp.server.ctx)
    fresh.load_state_dict(sd)
    sd2 = fresh.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    over = ["algorithm.a_th=2", "algorithm.k_hat=0.5"]
    full = run(tmp_path, "full", *over, base=MM, rounds=3)
    run(tmp_path, "split", *over, base=MM, rounds=2)
    resumed = run(tmp_path, "split", *over, base=MM, rounds=3, resume=True)
    drop = ("train_time_s", "wall_time_s")
    a = [{k: v for k, v in r.items() if k not in drop} for r in rows(full)]
    b = [{k: v for k, v in r.items() if k not in drop} for r in rows(resumed)]
    assert a == b


def test_registered_and_bad_params_are_one_line_errors():
    assert ALGORITHMS.get("pfedwireless").params is PFedWirelessParams
    for item, needle in [("algorithm.k_hat=1.5", "k_hat"), ("algorithm.k_hat=0", "k_hat"),
                         ("algorithm.a_th=-1", "a_th"), ("algorithm.schedule=fast", "schedule"),
                         ("algorithm.eta_hat=-1", "eta_hat")]:
        with pytest.raises(ConfigError, match=needle):
            load_config(None, [*MM, item])
