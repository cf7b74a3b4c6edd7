"""Whole runs on manifests (TOML-shaped configs through mmfl.config.resolve + Experiment):
short texts train above chance, the run folder keeps the label mapping, a manifest's public
rows are CreamFL's public set, and variable-length two-sensor sequences run FedCMI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mmfl.report import load_metrics

from helpers import experiment, run_config

try:
    from data_fixtures import write_manifest, write_png
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import write_manifest, write_png

CLASS_WORDS = {"sport": ["goal", "match", "team", "score", "coach", "league"],
               "politics": ["vote", "party", "election", "minister", "senate", "policy"],
               "film": ["movie", "actor", "scene", "director", "cinema", "premiere"]}
FILLER = ["the", "a", "today", "news", "said", "new", "big", "after", "we", "again"]


def short_texts(n_per_class: int, seed: int) -> list[tuple[str, str]]:
    """(text, label): 2 words of the class's 6 + 3 shared filler words, shuffled; separable by word."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_per_class):
        for label, words in CLASS_WORDS.items():
            toks = list(rng.choice(words, 2, replace=False)) + list(rng.choice(FILLER, 3))
            rng.shuffle(toks)
            out.append((" ".join(toks), label))
    return out


def text_manifest(root, seed=0) -> None:
    rows = [{"tweet": t, "label": y, "client": f"u{(i // 3) % 3}", "split": "train"}
            for i, (t, y) in enumerate(short_texts(20, seed))]
    rows += [{"tweet": t, "label": y, "client": "", "split": "test"} for t, y in short_texts(10, seed + 1)]
    write_manifest(root / "manifest.csv", rows)


def text_config(tmp_path, **data) -> dict:
    return {"name": "tweets", "rounds": 3, "seed": 0, "output_dir": str(tmp_path / "runs"), "threads": 1,
            "data": {"name": "manifest", "root": str(tmp_path), **data},
            "partition": {"name": "natural"}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"},
            "train": {"local_epochs": 2, "batch_size": 16, "optimizer": "adam", "lr": 0.01}}


def test_short_text_manifest_trains_above_chance_with_the_hash_encoder_and_saves_labels(tmp_path):
    text_manifest(tmp_path)
    run_config(text_config(tmp_path, text_encoder="hash:256"))
    rows = load_metrics(tmp_path / "runs" / "tweets")
    assert all(math.isfinite(r["train_loss"]) and r["train_loss"] < 2.0 for r in rows)
    assert rows[-1]["accuracy"] >= 0.8  # chance is 1/3 (30 test texts, 10 per class)
    labels = json.loads((tmp_path / "runs" / "tweets" / "labels.json").read_text())
    assert labels == {"film": 0, "politics": 1, "sport": 2}


def test_token_ids_train_the_models_embedding_encoder_above_chance(tmp_path):
    """text_encoder = "tokens" (no pretrained weights): the multimodal model picks its trainable
    token-embedding encoder for the id column (masked by length/<m>) and learns the texts."""
    text_manifest(tmp_path)
    cfg = text_config(tmp_path, text_encoder="tokens", text_max_tokens=8)
    cfg["model"] = {"name": "multimodal", "feat_dim": 32}
    exp = run_config(cfg)
    assert type(exp.server.model.encoders["tweet"]).__name__ == "TokenEncoder"
    rows = load_metrics(tmp_path / "runs" / "tweets")
    assert all(math.isfinite(r["train_loss"]) for r in rows) and rows[-1]["accuracy"] >= 0.8  # chance 1/3


def _pairs_manifest(root) -> None:
    """Image-text pairs: the image's colour and the text's word both name the class."""
    rng = np.random.default_rng(0)
    colours = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
    rows = []
    for i in range(54):
        name = list(colours)[i % 3]
        px = np.clip(np.array(colours[name]) + rng.integers(-25, 25, size=(8, 8, 3)), 0, 255)
        write_png(root / f"p{i}.png", px.astype(np.uint8))
        split = "train" if i < 24 else "test" if i < 36 else "public"
        rows.append({"image": f"p{i}.png", "text": f"a {name} square {rng.choice(FILLER)}", "label": name,
                     "split": split})
    write_manifest(root / "pairs.csv", rows)


def test_creamfl_uses_a_manifests_public_rows_as_its_public_set(tmp_path):
    _pairs_manifest(tmp_path)
    raw = {"name": "pairs", "rounds": 1, "seed": 0, "output_dir": str(tmp_path / "runs"), "threads": 1,
           "data": {"name": "manifest", "root": str(tmp_path), "manifest": "pairs.csv", "text_encoder": "hash:64"},
           "partition": {"name": "iid", "num_clients": 2},
           "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
           "algorithm": {"name": "creamfl"},
           "train": {"local_epochs": 1, "batch_size": 8, "optimizer": "adam", "lr": 0.001}}
    # + text-only clients from a manifest of short texts (its "tweet" column renamed to "text")
    (tmp_path / "tweets").mkdir()
    text_manifest(tmp_path / "tweets")
    raw["client_data"] = [{"data": {"name": "manifest", "root": str(tmp_path / "tweets"), "text_encoder": "hash:64",
                                    "rename": {"tweet": "text"}}, "partition": {"name": "natural"}}]
    exp = experiment(raw)
    fed = exp.federation
    assert len(fed.public) == 18 and set(fed.public.features) == {"image", "text"}
    assert len(fed.clients) == 5 and [set(c.features) for c in fed.clients[2:]] == [{"text"}] * 3
    exp.run()
    row = load_metrics(tmp_path / "runs" / "pairs")[-1]
    for key in ("i2t_r1", "t2i_r1", "r1_sum"):
        assert math.isfinite(row[key])
    assert row["clients"] == 5 and all(row["bytes_per_client"][str(c)]["up"] > 0 for c in range(5))
    raw.pop("client_data")
    # without public rows: the error says how to get a public set from a manifest
    rows = [r for r in __import__("csv").DictReader(open(tmp_path / "pairs.csv")) if r["split"] != "public"]
    write_manifest(tmp_path / "pairs.csv", rows)
    with pytest.raises(Exception, match=r"has no public set.*split = \"public\" rows in a manifest"):
        experiment(raw)


def _sensor_manifest(root) -> None:
    """Two sensors ([3, T_i] .npy, T_i in 20..40) whose mean level gives one of 3 classes."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(48):
        y = i % 3
        for s in ("acc", "gyro"):
            t = int(rng.integers(20, 41))
            x = rng.standard_normal((3, t)) + (y - 1) * 2.0 + (100.0 if s == "gyro" else 0.0)
            np.save(root / f"{s}{i}.npy", x.astype(np.float32))
        rows.append({"acc": f"acc{i}.npy", "gyro": f"gyro{i}.npy", "label": f"act{y}", "client": f"s{i % 4}",
                     "split": "train" if i < 36 else "test"})
    write_manifest(root / "sensors.csv", rows)


def test_fedcmi_runs_on_variable_length_two_sensor_sequences(tmp_path):
    _sensor_manifest(tmp_path)
    raw = {"name": "sensors", "rounds": 2, "seed": 0, "output_dir": str(tmp_path / "runs"), "threads": 1,
           "data": {"name": "manifest", "root": str(tmp_path), "manifest": "sensors.csv", "max_length": 40,
                    "normalize": True},
           "partition": {"name": "natural"},
           "model": {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [32], "two_projector": True},
           "algorithm": {"name": "fedcmi"},
           "train": {"optimizer": "sgd", "local_epochs": 2, "batch_size": 8, "lr": 0.01}}
    exp = experiment(raw)
    meta = exp.federation.meta
    assert meta.modalities == {"acc": (3, 40), "gyro": (3, 40)}
    assert abs(np.mean(meta.info["standardize"]["gyro"]["mean"]) - 100.0) < 1.0
    exp.run()
    rows = load_metrics(tmp_path / "runs" / "sensors")
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    assert rows[-1]["accuracy"] > 0.5  # chance is 1/3; the classes differ by the signals' level
