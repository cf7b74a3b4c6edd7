"""The label-distribution attack on CreamFL's public-set representations (issue 27 item 6;
mmfl/audit/label_skew.py), end to end on real runs: with single-class clients the server's
shadow clients recover every client's class; with IID clients the attack stays at the
no-information baseline (it invents no skew)."""

from __future__ import annotations

import numpy as np

from mmfl.audit.audit import audit, lines
from mmfl.audit.label_skew import sample_rows, score, simplex

from helpers import run_config


def creamfl_run(tmp_path, name, partition):
    raw = {"name": name, "rounds": 1, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat_pair", "public_fraction": 0.3}, "partition": partition,
           "modalities": {"name": "explicit", "holds": [["image"]] * 4},
           "model": {"name": "multimodal", "feat_dim": 16, "cnn_channels": [8, 8], "mlp_hidden": [64]},
           "algorithm": {"name": "creamfl", "server_batch_size": 64, "public_size": 300},
           "train": {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.001}}
    run_config(raw)
    return audit(tmp_path / name, rounds=1, invert=0, shadows=48)


def test_single_class_clients_give_their_class_away_and_iid_clients_stay_at_baseline(tmp_path):
    skew = creamfl_run(tmp_path, "skew", {"name": "k_classes", "k": 1, "num_clients": 4})
    r = skew["public_representations"]
    assert r["clients"] == 4 and all(c["true_top_share"] == 1.0 for c in r["per_client"].values())
    assert r["top_hit_rate"] == 1.0, r  # every client's class (chance 10 %)
    assert r["tv_mean"] < r["tv_uniform_mean"] - 0.3, r  # uniform: TV 0.9
    assert any("public-set representations" in t for t in lines(skew))
    iid = creamfl_run(tmp_path, "iid", {"name": "iid", "num_clients": 4})
    r = iid["public_representations"]
    assert r["tv_uniform_mean"] < 0.1  # IID: every client near uniform
    assert r["tv_mean"] < r["tv_uniform_mean"] + 0.1, r  # at the baseline: no skew invented
    assert max(max(c["predicted"]) for c in r["per_client"].values()) < 0.5, r


def test_the_attacks_helpers():
    v = simplex(np.array([0.9, 0.4, -0.3]))
    assert np.isclose(v.sum(), 1) and (v >= 0).all() and v[2] == 0
    rows = sample_rows(np.repeat(np.arange(3), 5), np.array([1.0, 0, 0]), 8, np.random.default_rng(0))
    assert len(rows) == 8 and (rows < 5).all()  # only class 0, drawn with replacement (5 rows of it)
    s = score(np.array([0.8, 0.1, 0.1]), np.array([9, 1, 0]))
    assert s["top_hit"] and np.isclose(s["tv"], 0.1) and np.isclose(s["tv_uniform"], 0.9 - 1 / 3)
