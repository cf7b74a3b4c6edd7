"""The leakage audit (issue 27 item 6): each attack recovers what it should in a constructed
easy case and does worse with DP; ``mmfl audit`` on a real run prints its lines and leaves
the run folder as it was."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.audit.attacks import (bias_update, invert_update, label_inference, membership_auc, nearest_cosine,
                                probe_rows)

C = 6


class Tiny(nn.Module):
    def __init__(self, d=12):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(d, 16), nn.ReLU())
        self.classifier = nn.Linear(16, C)

    def forward(self, x):
        return {"logits": self.classifier(self.features(x["x"]))}


def one_step(model, x, y, lr=0.1):
    sent = {k: v.clone() for k, v in model.state_dict().items()}
    loss = F.cross_entropy(model({"x": x})["logits"], y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return sent, {k: v.clone() for k, v in model.state_dict().items()}


def local_dp(sent, reply, clip, z, g):
    """mmfl's local DP on one update (docs/dp.md): clip the flat update to norm clip, add N(0, (z clip)^2)."""
    d = {k: reply[k] - sent[k] for k in sent}
    norm = torch.sqrt(sum((v ** 2).sum() for v in d.values()))
    s = min(1.0, clip / float(norm))
    return {k: sent[k] + d[k] * s + z * clip * torch.randn(d[k].shape, generator=g) for k in sent}


def test_idlg_recovers_the_label_of_a_single_sample_update_exactly_and_not_under_dp():
    g = torch.Generator().manual_seed(0)
    hits, dp_hits = [], []
    for t in range(30):
        torch.manual_seed(t)
        model = Tiny()
        x, y = torch.randn(1, 12, generator=g), torch.randint(0, C, (1,), generator=g)
        sent, reply = one_step(model, x, y)
        counts = np.bincount(y.numpy(), minlength=C)
        hits.append(label_inference(bias_update(sent, reply, C), counts)["predicted"] == int(y))
        noisy = local_dp(sent, reply, clip=0.05, z=2.0, g=g)
        dp_hits.append(label_inference(bias_update(sent, noisy, C), counts)["predicted"] == int(y))
    assert all(hits)  # iDLG: exact for one sample
    assert np.mean(dp_hits) < 0.6  # local DP (z = 2): near chance (1/6)


def test_gradient_inversion_reconstructs_a_single_sample_better_than_chance():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = Tiny()
    rows = torch.randn(20, 12, generator=g)
    x, y = rows[:1], torch.tensor([2])
    sent, reply = one_step(model, x, y, lr=0.01)
    rec = invert_update(Tiny(), sent, reply, {"x": x}, label=2, steps=300)
    cos = nearest_cosine(rec["x"], rows)
    chance = nearest_cosine(torch.randn(1, 12, generator=g), rows)
    assert cos > 0.9 > chance + 0.2, (cos, chance)


def test_membership_auc_is_high_for_an_overfit_model_and_half_for_an_honest_score():
    rng = np.random.default_rng(0)
    members = rng.exponential(0.05, 500)  # an overfit model: tiny losses on its training rows
    non = rng.exponential(1.0, 500)
    assert membership_auc(members, non)["auc"] > 0.9
    same = membership_auc(rng.exponential(1.0, 500), rng.exponential(1.0, 500))
    assert abs(same["auc"] - 0.5) < 0.06


def test_the_probe_reads_labels_and_reconstructs_a_correlated_private_modality():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    shared = np.eye(3)[y] * 2 + rng.normal(0, 0.5, (600, 3))
    private = shared @ rng.normal(0, 1, (3, 8)) + rng.normal(0, 0.1, (600, 8))
    out = probe_rows(shared[:400], private[:400], y[:400], shared[400:], private[400:], y[400:])
    assert out["label_accuracy"] > 0.9 > out["label_chance"]
    assert out["reconstruction_cosine"] > 0.5  # centred: 0 = the auxiliary mean row


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_mmfl_audit_on_a_real_run_prints_its_lines_and_leaves_the_run_as_it_was(tmp_path):
    root = Path(__file__).resolve().parents[1]
    mmfl = [sys.executable, "-m", "mmfl.cli"]
    common = ["--set", f"output_dir={str(tmp_path)!r}", "--set", "threads=1", "--no-progress"]
    subprocess.run([*mmfl, "run", "mmfl/configs/demo.toml", "--set", "rounds=1", "--set", "name=a",
                    "--set", "partition.num_clients=4", *common], cwd=root, check=True, capture_output=True)
    before = _digest(tmp_path / "a")
    out = subprocess.run([*mmfl, "audit", str(tmp_path / "a"), "--steps", "30", "--invert", "1",
                          "--json", str(tmp_path / "audit.json")], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "labels from updates: majority class of" in out.stdout and "membership (loss threshold): AUC" in out.stdout
    assert _digest(tmp_path / "a") == before
    bad = subprocess.run([*mmfl, "audit", str(tmp_path / "nowhere")], cwd=root, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "not an mmfl run folder" in bad.stderr
