"""Client-level differential privacy ([dp], mmfl.core.dp, mmfl.engine.dp_runtime): clipping, noise scale,
central DP without noise = uniform FedAvg, the accountant against Opacus called directly, a
bit-exact resume, and one-line errors for bad values."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.config import load_config
from mmfl.core.aggregation import aggregate
from mmfl.core.dp import (central_dp_mean, central_epsilon, clip_update, flat_norm, local_epsilon, local_privatize,
                          update_deltas)
from mmfl.engine.runner import Experiment
from mmfl.errors import ConfigError
from mmfl.report import compare

from helpers import DIGITS, rows, run, timeless

BASE = [*DIGITS, "partition.num_clients=4", "clients_per_round=3"]


def run_exp(tmp_path, name, *over, rounds=2, resume=False) -> Experiment:
    return run(tmp_path, name, *over, base=BASE, rounds=rounds, resume=resume)


def rows_of(exp) -> list[dict]:
    return timeless(rows(exp))


def _updates(n=5, seed=0, scale=None):
    g = torch.Generator().manual_seed(seed)
    prev = {"a.w": torch.randn(4, 3, generator=g), "a.b": torch.randn(3, generator=g),
            "bn.num_batches_tracked": torch.tensor(2)}
    ups = []
    for k in range(n):
        s = scale[k] if scale else 1.0
        ups.append({"a.w": prev["a.w"] + s * torch.randn(4, 3, generator=g),
                    "a.b": prev["a.b"] + s * torch.randn(3, generator=g),
                    "bn.num_batches_tracked": torch.tensor(2 + k)})
    return ups, prev


def test_clipping_bounds_every_update_norm_and_keeps_small_ones():
    ups, prev = _updates(6, scale=[0.01, 0.1, 1.0, 10.0, 100.0, 1e4])
    for d in update_deltas(ups, prev):
        norm = float(flat_norm(d))
        clipped, before = clip_update(d, 1.5)
        assert before == pytest.approx(norm)
        assert float(flat_norm(clipped)) <= 1.5 * (1 + 1e-12)
        if norm <= 1.5:  # unchanged below the threshold
            assert all(torch.equal(clipped[k], d[k]) for k in d)
        else:  # scaled onto the sphere, direction kept
            assert float(flat_norm(clipped)) == pytest.approx(1.5)
            assert torch.allclose(clipped["a.w"] * norm / 1.5, d["a.w"])
    # local DP without noise: the sent update's norm is bounded too
    for u in ups:
        sent = local_privatize(u, prev, 1.5, 0.0, seed=1)
        assert float(flat_norm(update_deltas([sent], prev)[0])) <= 1.5 * (1 + 1e-6)


def test_central_dp_with_noise_multiplier_zero_and_huge_clip_norm_equals_uniform_fedavg():
    ups, prev = _updates(5)
    got = central_dp_mean(ups, prev, clip_norm=1e12, noise_multiplier=0.0, seed=0)
    want = aggregate("mean", ups, [1.0] * 5, prev)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6), k
    assert int(got["bn.num_batches_tracked"]) == 6  # integer keys: the maximum, as weighted_mean


def test_central_dp_noise_std_on_the_aggregate_is_z_c_over_n():
    # every client sends the global model back: the aggregate minus w^t is the noise / n alone
    prev = {"w": torch.zeros(200_000)}
    ups = [{"w": torch.zeros(200_000)} for _ in range(4)]
    z, c = 2.0, 0.5
    out = central_dp_mean(ups, prev, clip_norm=c, noise_multiplier=z, seed=123)["w"].double()
    assert out.mean().abs() < 5 * (z * c / 4) / math.sqrt(200_000)
    assert float(out.std()) == pytest.approx(z * c / 4, rel=0.01)  # 0.25, std error ~0.16%
    # a fixed denominator (the sampled cohort): 2 replies of a cohort of 8 -> std z C / 8
    out8 = central_dp_mean(ups[:2], prev, clip_norm=c, noise_multiplier=z, seed=123, denominator=8)["w"].double()
    assert float(out8.std()) == pytest.approx(z * c / 8, rel=0.01)
    # local DP: each client's update gets std z C
    loc = local_privatize({"w": torch.zeros(200_000)}, prev, c, z, seed=5)["w"].double()
    assert float(loc.std()) == pytest.approx(z * c, rel=0.01)


def test_epsilon_is_monotone_in_rounds_and_matches_opacus_called_directly():
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    q, z, delta = 0.3, 1.1, 1e-5
    eps = [central_epsilon(q, z, t, delta) for t in range(0, 30)]
    assert eps[0] == 0.0
    assert all(b > a for a, b in zip(eps, eps[1:]))
    for t in (1, 7, 29):
        rdp = compute_rdp(q=q, noise_multiplier=z, steps=t, orders=RDPAccountant.DEFAULT_ALPHAS)
        direct, _ = get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
        assert eps[t] == pytest.approx(direct, rel=1e-12)
    # local DP: multiplier z / 2 (sensitivity 2C), no sampling
    rdp = compute_rdp(q=1.0, noise_multiplier=z / 2, steps=5, orders=RDPAccountant.DEFAULT_ALPHAS)
    assert local_epsilon(z, 5, delta) == pytest.approx(get_privacy_spent(
        orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)[0], rel=1e-12)
    assert central_epsilon(q, 0.0, 3, delta) == math.inf
    assert central_epsilon(q, 2.0, 10, delta) < central_epsilon(q, 1.0, 10, delta)  # more noise, less epsilon


@pytest.mark.parametrize("mode", ["central", "local"])
def test_dp_resume_is_bit_exact_and_epsilon_is_in_the_metrics(tmp_path, mode):
    over = [f"dp.mode={mode}", "dp.clip_norm=0.5", "dp.noise_multiplier=0.8", "dp.delta=1e-4"]
    full = run_exp(tmp_path, "full", *over, rounds=4)
    run_exp(tmp_path, "split", *over, rounds=2)
    resumed = run_exp(tmp_path, "split", *over, rounds=4, resume=True)
    a, b = rows_of(full), rows_of(resumed)
    assert [r["round"] for r in b] == [1, 2, 3, 4] and a == b
    for k, v in full.server.state_dict().items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k
    eps = [r["dp/epsilon"] for r in a]
    assert all(r["dp/delta"] == 1e-4 for r in a)
    assert all(y >= x for x, y in zip(eps, eps[1:])) and eps[0] > 0
    if mode == "central":
        assert eps == [pytest.approx(central_epsilon(3 / 4, 0.8, t, 1e-4)) for t in (1, 2, 3, 4)]
    table = compare([full.run_dir])
    assert "epsilon (delta)" in table and f"{eps[-1]:.3g} (1e-04)" in table


def test_central_dp_run_without_noise_and_huge_clip_equals_uniform_fedavg_run(tmp_path):
    plain = run_exp(tmp_path, "mean", "algorithm.aggregation=mean")
    dp = run_exp(tmp_path, "dp", "dp.clip_norm=1e12", "dp.noise_multiplier=0.0")
    for k, v in plain.server.state_dict().items():
        assert torch.allclose(v.double(), dp.server.state_dict()[k].double(), atol=1e-6), k


def test_noise_changes_the_model_and_different_rounds_draw_different_noise(tmp_path):
    a = run_exp(tmp_path, "a", "dp.noise_multiplier=1.0", rounds=1)
    b = run_exp(tmp_path, "b", "dp.noise_multiplier=0.0", rounds=1)
    # the model itself (the server state also holds the accountant's epsilon, which differs without noise)
    diff = [float((a.server.model.state_dict()[k].double() - b.server.model.state_dict()[k].double()).abs().max())
            for k in a.server.model.state_dict()]
    assert max(diff) > 0


@pytest.mark.parametrize("over,match", [
    (['dp.mode="dpsgd"'], r"^dp.mode: must be one of \['central', 'local', 'sample', 'rows'\], got 'dpsgd'$"),
    (["dp.clip_norm=0"], r"^dp.clip_norm: must be a positive number, got 0"),
    (["dp.clip_norm=-1.5"], r"^dp.clip_norm: must be a positive number, got -1.5$"),
    (["dp.noise_multiplier=-0.1"], r"^dp.noise_multiplier: must be a number >= 0, got -0.1$"),
    (['dp.noise_multiplier="lots"'], r"^dp.noise_multiplier: expected a number, got 'lots'$"),
    (["dp.delta=0"], r"^dp.delta: must be in \(0, 1\), got 0"),
    (["dp.delta=1.0"], r"^dp.delta: must be in \(0, 1\), got 1.0$"),
    (["dp.epsilon=3"], r"^dp.epsilon: unknown key"),
    (["dp=3"], r"^dp: must be a table"),
    (["algorithm.name=scaffold", "dp.mode=central"], r"^dp: algorithm 'scaffold' does not support client-level DP"),
    (["algorithm.aggregation=krum", "dp.mode=central"], r"^dp.mode: central DP aggregates by DP-FedAvg's clipped"),
])
def test_bad_dp_values_are_one_line_naming_the_field(tmp_path, over, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, [*BASE, *over, f"output_dir={tmp_path}"])
    assert "\n" not in str(e.value)


def test_local_dp_keeps_a_robust_rule_and_the_cli_error_is_one_line(tmp_path, capsys):
    from mmfl.cli import demo_config_path, main

    load_config(None, [*BASE, "dp.mode=local", "algorithm.aggregation=median", f"output_dir={tmp_path}"])
    rc = main(["run", str(demo_config_path()), "--set", "dp.noise_multiplier=-1", "--set", "rounds=1",
               "--set", f"output_dir='{tmp_path}'"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["mmfl: error: dp.noise_multiplier: must be a number >= 0, got -1.0"]
