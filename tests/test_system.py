"""The [system] model (mmfl.core.system): path loss, rates and latencies equal hand
computations, placement and fading are seeded, a round lasts as long as its slowest device,
computation uses the model's FLOPs, and the model adds time without changing training."""

from __future__ import annotations

import json
import math
import tomllib

import numpy as np
import pytest

from mmfl.config import load_config, resolve
from mmfl.data.federation import build_federation
from mmfl.models.factory import model_factory
from mmfl.core.system import (WirelessSystem, computation_latency, dbm_to_watts, local_iterations,
                                path_loss_db, place_devices, rayleigh_amplitude, shannon_rate,
                                transmission_latency)
from mmfl.errors import ConfigError

from helpers import config, experiment, rows, run

BASE = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=2", "train.batch_size=128", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]
MM = ["data.name=mfeat", 'data.views=["pix", "fou"]', "case=D", "partition.num_clients=4",
      "clients_per_round=3", "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[32]",
      "train.local_epochs=1", "train.batch_size=64", "train.optimizer=adam", "train.lr=0.001", "threads=1"]


def make_system(*over, base=BASE):
    cfg = load_config(None, [*base, "system.name=wireless", *over])
    fed = build_federation(cfg)
    make = model_factory(cfg, fed.meta)
    return WirelessSystem(cfg, fed, lambda cid: make(fed.modalities_of(cid), fed.group_of(cid))), cfg, fed


# ----------------------------------------------------------------------------- formulas by hand

def test_path_loss_equals_hand_computation():
    # PL(d) = 32.4 + 20 log10(f_c [GHz]) + 20 log10(d [m]); 20 log10(2.6) = 8.29946695941636
    assert path_loss_db(10.0, 2.6) == pytest.approx(32.4 + 8.29946695941636 + 20.0, abs=1e-12)
    assert path_loss_db(1.0, 2.6) == pytest.approx(40.69946695941636, abs=1e-12)
    assert path_loss_db(50.0, 2.6) == pytest.approx(40.69946695941636 + 20 * math.log10(50), abs=1e-12)
    assert np.allclose(path_loss_db(np.array([10.0, 100.0]), 1.0), [52.4, 72.4])


def test_dbm_to_watts():
    assert dbm_to_watts(30) == pytest.approx(1.0)
    assert dbm_to_watts(0) == pytest.approx(1e-3)
    assert dbm_to_watts(23) == pytest.approx(0.19952623149688797)
    assert dbm_to_watts(-174) == pytest.approx(10 ** -20.4)


def test_rate_and_transmission_latency_equal_hand_computation():
    b, n0, p = 1e6, 1e-20, 0.5
    g = math.sqrt(1023 * b * n0 / p)  # SNR = p g^2 / (B N0) = 1023 -> log2(1024) = 10 bit/s/Hz
    assert shannon_rate(b, p, g, n0) == pytest.approx(1e7)
    assert transmission_latency(1_000_000, 1e7) == pytest.approx(0.8)  # 8e6 bits at 1e7 bit/s
    assert transmission_latency(0, 1e7) == 0.0


def test_computation_latency_eq9_and_local_iterations():
    # eq. 9: N_k O_k / (f_k e_k) = 10 x 1e9 / (1e9 x 16)
    assert computation_latency(10, 1e9, 1e9, 16) == pytest.approx(0.625)
    assert local_iterations(130, 64, 2) == (6, 260)  # batches 64, 64, 2 per epoch
    assert local_iterations(129, 64, 1) == (2, 128)  # a last batch of one sample is skipped (local_train)
    assert local_iterations(128, 64, 3) == (6, 384)
    assert local_iterations(1, 64, 2) == (2, 2)  # a one-sample client trains on it
    assert local_iterations(3, 1, 1) == (0, 0)  # batches of one are all skipped


def test_placement_is_uniform_in_the_disc_and_seeded():
    d = place_devices(20000, 100.0, np.random.default_rng(0), min_distance_m=1.0)
    assert d.min() >= 1.0 and d.max() <= 50.0
    assert np.mean(d <= 25.0) == pytest.approx(0.25, abs=0.015)  # uniform in area: P(r <= R/2) = 1/4
    assert np.array_equal(d, place_devices(20000, 100.0, np.random.default_rng(0)))


def test_rayleigh_amplitude_has_the_paper_mean():
    g = rayleigh_amplitude(np.full(200_000, 1e-3), np.random.default_rng(1))
    assert g.mean() == pytest.approx(1e-3, rel=0.01)  # E[g] = 10^(-PL/20)
    assert (g ** 2).mean() == pytest.approx(4 / math.pi * 1e-6, rel=0.02)  # E[g^2] = (4/pi) mean^2


# ----------------------------------------------------------------------------- the run's model

def test_wireless_latency_equals_hand_computation_without_fading():
    sys_, cfg, fed = make_system("system.fading=none", "system.bandwidth_hz=2e6")
    p = cfg.system
    d = sys_.distance_m[1]
    pl = 32.4 + 20 * math.log10(2.6) + 20 * math.log10(d)
    g2 = (10 ** (-pl / 20)) ** 2
    n0 = 10 ** ((-174 - 30) / 10)
    rate_down = 2e6 * math.log2(1 + 1.0 * g2 / (2e6 * n0))  # p^ = 30 dBm = 1 W
    rate_up = 2e6 * math.log2(1 + 10 ** ((23 - 30) / 10) * g2 / (2e6 * n0))
    n = len(fed.clients[1])
    iters, samples = 2 * math.ceil(n / 128), 2 * n  # no batch of one sample here
    assert n % 128 > 1 and sys_.iterations(1) == (iters, samples)
    fwd = 2 * (64 * 16 + 16 * 10)  # the MLP 64 -> 16 -> 10: 2 x multiply-accumulates per sample
    t_cmp = 3 * fwd * samples / (1e9 * 16)  # eq. 9 with O_k = 3 x forward, f = 1e9, e = 16
    t = sys_.client_latency(5, 1, down=1000, up=2000)
    assert t["download"] == pytest.approx(8000 / rate_down, rel=1e-12)
    assert t["upload"] == pytest.approx(16000 / rate_up, rel=1e-12)
    assert t["compute"] == pytest.approx(t_cmp, rel=1e-12)
    assert sys_.flops_per_iteration(1) * iters == pytest.approx(3 * fwd * samples)
    assert p.fading == "none" and np.array_equal(sys_.amplitude(5), sys_.mean_amplitude)


def test_round_latency_is_the_slowest_device():
    sys_, _, _ = make_system()
    per = {"0": {"down": 10_000, "up": 20_000}, "1": {"down": 10_000, "up": 5_000_000}, "2": {"down": 0, "up": 0}}
    out = sys_.round_latency(3, per)
    each = {c: sum(sys_.client_latency(3, int(c), v["down"], v["up"]).values()) for c, v in per.items()}
    assert out["sim_time_s"] == pytest.approx(max(each.values()))
    assert out["sim_straggler"] == 1  # 5 MB up
    assert out["sim_download_s"] + out["sim_compute_s"] + out["sim_upload_s"] == pytest.approx(out["sim_time_s"])
    assert out["sim_latency_per_client"] == pytest.approx(each)
    assert sys_.round_latency(3, {})["sim_time_s"] == 0.0
    # steps override N_k of eq. 9
    assert sys_.compute_latency(0, steps=1) == pytest.approx(sys_.flops_per_iteration(0) / (1e9 * 16))


def test_fading_is_redrawn_every_round_and_deterministic():
    a, _, _ = make_system()
    b, _, _ = make_system()
    g0, g1 = a.amplitude(0).copy(), a.amplitude(1).copy()
    assert not np.allclose(g0, g1)
    assert np.array_equal(b.amplitude(1), g1) and np.array_equal(b.amplitude(0), g0)  # any order
    assert np.array_equal(a.distance_m, b.distance_m)
    c, _, _ = make_system("seed=7")
    assert not np.allclose(c.distance_m, a.distance_m)
    assert a.upload_rate(0, 0) < a.download_rate(0, 0)  # 23 dBm up, 30 dBm down, same channel


def test_cycles_range_is_drawn_per_device_and_seeded():
    a, _, _ = make_system("system.cycles_per_s=[1e9, 2e9]")
    b, _, _ = make_system("system.cycles_per_s=[1e9, 2e9]")
    assert np.all((a.cycles_per_s >= 1e9) & (a.cycles_per_s <= 2e9)) and len(set(a.cycles_per_s)) == 3
    assert np.array_equal(a.cycles_per_s, b.cycles_per_s)
    t = [a.compute_latency(c) * a.cycles_per_s[c] for c in range(3)]  # FLOPs / e_k, frequency removed
    assert t == pytest.approx([make_system()[0].compute_latency(c) * 1e9 for c in range(3)])


def test_compute_latency_uses_each_model_structure_flops():
    # case D: clients holding one modality build smaller models than multimodal clients
    sys_, _, fed = make_system(base=MM)
    holds = [fed.modalities_of(c) for c in range(fed.num_clients)]
    per_sample = [sys_.forward_flops_per_sample(c) for c in range(fed.num_clients)]
    both = [f for f, h in zip(per_sample, holds) if len(h) == 2]
    one = [f for f, h in zip(per_sample, holds) if len(h) == 1]
    assert both and one and min(both) > max(one)
    from mmfl.models.flops import count_flops

    c = next(i for i, h in enumerate(holds) if len(h) == 1)
    inputs, _ = fed.clients[c].get(None)
    model = model_factory(load_config(None, [*MM]), fed.meta)(fed.modalities_of(c))
    assert per_sample[c] == pytest.approx(count_flops(model, inputs) / len(fed.clients[c]))


# ----------------------------------------------------------------------------- in a run

def strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("sim_") and not k.endswith("_time_s")} for r in rows]


@pytest.mark.parametrize("base,algo", [(BASE, "fedavg"), (MM, "mfedavg")])
def test_system_model_adds_time_without_changing_results(tmp_path, base, algo):
    plain = run(tmp_path, "plain", f"algorithm.name={algo}", base=base)
    timed = experiment(config(tmp_path, "timed", f"algorithm.name={algo}", "system.name=wireless", base=base))
    summary = timed.run()
    a, b = rows(plain), rows(timed)
    assert strip(a) == strip(b)
    assert not any(k.startswith("sim_") for r in a for k in r)
    assert plain.server.ctx.system is None and timed.server.ctx.system is timed.system
    for r in b:
        assert r["sim_time_s"] > 0 and set(r["sim_latency_per_client"]) == set(r["bytes_per_client"])
    assert b[1]["sim_time_total_s"] == pytest.approx(b[0]["sim_time_s"] + b[1]["sim_time_s"])
    assert summary["sim_time_total_s"] == pytest.approx(b[1]["sim_time_total_s"])
    assert "sim_time_total_s" not in json.loads((plain.run_dir / "summary.json").read_text())


def test_resumed_run_continues_the_simulated_clock(tmp_path):
    full = run(tmp_path, "full", "system.name=wireless", base=BASE, rounds=3)
    run(tmp_path, "split", "system.name=wireless", base=BASE, rounds=1)
    resumed = run(tmp_path, "split", "system.name=wireless", base=BASE, rounds=3, resume=True)
    a, b = rows(full), rows(resumed)
    keep = ("sim_time_s", "sim_time_total_s", "sim_straggler", "sim_latency_per_client")
    assert [{k: r[k] for k in keep} for r in a] == [{k: r[k] for k in keep} for r in b]


# ----------------------------------------------------------------------------- config

def test_system_table_round_trips_and_is_off_when_absent():
    cfg = load_config(None, [*BASE, "system.bandwidth_hz=2e6", "system.cycles_per_s=[1e9, 3e9]"])
    again = resolve(tomllib.loads(cfg.to_toml()))
    assert again.to_dict() == cfg.to_dict() and again.system == cfg.system
    assert cfg.to_dict()["system"]["cycles_per_s"] == [1e9, 3e9]
    plain = load_config(None, BASE)
    assert plain.system is None and "system" not in plain.to_dict()


@pytest.mark.parametrize("item,needle", [
    ("system.bandwidth_hz=0", "system.bandwidth_hz: must be a positive number"),
    ("system.flops_per_cycle=-1", "system.flops_per_cycle: must be a positive number"),
    ("system.diameter_m=0", "system.diameter_m: must be a positive number"),
    ("system.cycles_per_s=[2e9, 1e9]", "system.cycles_per_s: must be a positive number or [min, max]"),
    ("system.cycles_per_s=[1e9]", "system.cycles_per_s"),
    ("system.cycles_per_s=0", "system.cycles_per_s"),
    ("system.min_distance_m=60", "system.min_distance_m: must be at most the radius"),
    ("system.bs_power_dbm=inf", "system.bs_power_dbm: must be a finite number"),
    ("system.name=cable", "system.name: must be one of ['wireless']"),
    ("system.fading=rician", "system.fading: must be one of"),
    ("system.bandwith_hz=1e6", "did you mean 'bandwidth_hz'"),
    ("system=3", "system: must be a table"),
])
def test_bad_system_params_are_one_line_errors(item, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [*BASE, item])
    assert needle in str(e.value) and "\n" not in str(e.value)
