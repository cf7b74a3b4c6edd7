"""``mmfl run --reference`` (mmfl.reference, docs/reference.md): centralized, local-only and
scikit-learn references on the same split and features, beside the federated result; per family
(classification, multimodal, retrieval, personalized); the [reference] table; the API's
``Result.reference``; ``mmfl report``; resume without retraining; Flower refuses them."""

from __future__ import annotations

import json
import tomllib

import pytest
import tomli_w

import mmfl.api as api
from mmfl.algorithms import ALGORITHMS
from mmfl.cli import main
from mmfl.config import resolve
from mmfl.errors import ConfigError
from mmfl.reference import family

try:
    from test_manifest_runs import _pairs_manifest, _sensor_manifest, text_config, text_manifest
except ImportError:  # tests/ imported as a package
    from tests.test_manifest_runs import _pairs_manifest, _sensor_manifest, text_config, text_manifest

pytestmark = pytest.mark.usefixtures("one_thread")


def _text_toml(tmp_path, **extra) -> str:
    text_manifest(tmp_path)
    raw = text_config(tmp_path, text_encoder="hash:256")
    raw.update(rounds=2, **extra)
    path = tmp_path / "tweets.toml"
    path.write_text(tomli_w.dumps(raw))
    return str(path)


def test_reference_on_a_tiny_classification_run_prints_every_method_under_the_federated_result(tmp_path, capsys):
    cfg = _text_toml(tmp_path)
    assert main(["run", cfg, "--no-progress", "--reference"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("references (pooled data, simulation only)"):].splitlines()
    assert "metric: test accuracy" in table[0]
    methods = [line.split("  ")[1].strip() for line in table[2:7]]
    assert methods == ["fedavg (federated)", "centralized", "local-only", "logistic regression", "random forest"]
    run = tmp_path / "runs" / "tweets"
    central = run / "reference" / "centralized"
    saved = tomllib.loads((central / "config.toml").read_text())
    parent = tomllib.loads((run / "config.toml").read_text())
    # the same model, [train], rounds and split; pooled (the centralized algorithm)
    assert saved["algorithm"] == {"name": "centralized"} and saved["rounds"] == parent["rounds"] == 2
    assert saved["train"] == parent["train"] and saved["model"] == parent["model"] and saved["data"] == parent["data"]
    assert "reference" in parent and "reference" not in saved
    rows = [json.loads(line) for line in (central / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["clients"] == 1  # one client holding every row
    local = [json.loads(line) for line in (run / "reference" / "local" / "metrics.jsonl").read_text().splitlines()]
    assert len(local[-1]["client_accuracy"]) == 3  # each client its own model (3 natural clients)
    sk = json.loads((run / "reference" / "sklearn.json").read_text())["results"]
    assert sk["logistic_regression"]["train_rows"] == 60 and sk["logistic_regression"]["accuracy"] > 0.6  # chance 1/3
    assert sk["random_forest"]["features"] == 256


def test_multimodal_reference_via_the_api_gives_a_dataframe_with_uar(tmp_path):
    _sensor_manifest(tmp_path)
    raw = {"name": "sensors", "rounds": 1, "seed": 0, "output_dir": str(tmp_path / "runs"), "threads": 1,
           "data": {"name": "manifest", "root": str(tmp_path), "manifest": "sensors.csv", "max_length": 40,
                    "normalize": True},
           "partition": {"name": "natural"},
           "model": {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [32], "two_projector": True},
           "algorithm": {"name": "fedcmi"},
           "train": {"local_epochs": 1, "batch_size": 8, "lr": 0.01}}
    res = api.run(raw, reference=True, progress=False)
    df = res.reference
    assert list(df["method"])[:3] == ["fedcmi (federated)", "centralized", "local-only"]
    assert set(df.columns) == {"method", "metric", "final", "best", "uar", "note"}
    assert df["uar"].iloc[0] is not None and 0 <= df["final"].iloc[3] <= 1  # LR on both sensors
    sk = json.loads((res.run_dir / "reference" / "sklearn.json").read_text())["results"]["logistic_regression"]
    assert sk["columns"] == ["acc", "gyro", "length/acc", "length/gyro"] and sk["features"] == 2 * 3 * 40 + 2
    assert api.load_run(res.run_dir).reference.equals(df)
    assert api.run(raw, overwrite=True, progress=False).reference is None  # --overwrite deletes them


def test_creamfl_family_gets_the_server_alone_and_says_classifiers_do_not_apply(tmp_path, capsys):
    _pairs_manifest(tmp_path)
    raw = {"name": "pairs", "rounds": 2, "seed": 0, "output_dir": str(tmp_path / "runs"), "threads": 1,
           "data": {"name": "manifest", "root": str(tmp_path), "manifest": "pairs.csv", "text_encoder": "hash:64"},
           "partition": {"name": "iid", "num_clients": 2},
           "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
           "algorithm": {"name": "fedmd"},
           "train": {"local_epochs": 1, "batch_size": 8, "optimizer": "adam", "lr": 0.001}}
    path = tmp_path / "pairs.toml"
    path.write_text(tomli_w.dumps(raw))
    assert main(["run", str(path), "--no-progress", "--reference"]) == 0
    out = capsys.readouterr().out
    assert "metric: R@1 sum" in out
    lr = next(line for line in out.splitlines() if line.strip().startswith("logistic regression"))
    assert "does not apply to retrieval" in lr and "%" not in lr
    alone = tmp_path / "runs" / "pairs" / "reference" / "server_alone"
    rows = [json.loads(line) for line in (alone / "metrics.jsonl").read_text().splitlines()]
    # the server trained on its public set and reached no client
    assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 and r["clients_replied"] == 0 for r in rows)
    assert all(r["server_public_loss"] > 0 for r in rows) and "r1_sum" in rows[-1]
    assert tomllib.loads((alone / "config.toml").read_text())["algorithm"]["name"] == "creamfl"
    assert not (tmp_path / "runs" / "pairs" / "reference" / "sklearn.json").exists()


def test_the_family_comes_from_the_declared_evaluations():
    fam = {e.name: family(e.factory) for e in ALGORITHMS.entries()}
    assert fam["fedavg"] == fam["moon"] == fam["fedcmi"] == fam["partialfl"] == "classification"
    assert fam["creamfl"] == fam["fedmd"] == fam["creamfl_fedavg"] == "retrieval"
    assert fam["pfedwireless"] == fam["fedfomo"] == fam["fedamp"] == fam["fedmsplit"] == "personalized"
    assert fam["local"] == "clients"


def test_reference_table_in_the_config_and_its_checks(tmp_path):
    cfg = _text_toml(tmp_path, reference={"methods": ["logistic_regression"]})
    assert main(["run", cfg, "--no-progress"]) == 0  # the table alone asks for the references
    ref = tmp_path / "runs" / "tweets" / "reference"
    assert (ref / "sklearn.json").is_file() and not (ref / "centralized").exists()
    assert [r["method"] for r in api.load_run(ref.parent).reference.to_dict("records")] == \
        ["fedavg (federated)", "logistic regression"]
    base = tomllib.loads(open(cfg).read())
    for bad, msg in (({"methods": ["svm"]}, "reference.methods: unknown method 'svm'"),
                     ({"sklearn_max_rows": 0}, "reference.sklearn_max_rows: must be an integer >= 1"),
                     ({"colour": 1}, "colour"), (3, "reference: must be a table")):
        with pytest.raises(ConfigError, match=msg):
            resolve({**base, "reference": bad})
    off = resolve({**base, "reference": {"enabled": False}})
    assert off.reference.enabled is False


def test_report_shows_the_references_of_one_and_of_several_runs(tmp_path, capsys):
    cfg = _text_toml(tmp_path, reference={"methods": ["centralized", "logistic_regression"]})
    main(["run", cfg, "--no-progress"])
    main(["run", cfg, "--no-progress", "--set", "name=plain", "--set", "reference.enabled=false"])
    capsys.readouterr()
    run, plain = tmp_path / "runs" / "tweets", tmp_path / "runs" / "plain"
    assert main(["report", str(run), "--plot", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert "tweets: references (pooled data, simulation only)" in out and "centralized" in out
    assert main(["report", str(run), str(plain), "--plot", str(tmp_path / "b.png")]) == 0
    out = capsys.readouterr().out
    assert out.count("references (pooled data, simulation only)") == 1 and "logistic regression" in out


def test_resume_does_not_retrain_finished_references(tmp_path, capsys):
    cfg = _text_toml(tmp_path)
    main(["run", cfg, "--no-progress", "--reference"])
    ref = tmp_path / "runs" / "tweets" / "reference"
    before = {p: p.stat().st_mtime_ns for p in (ref / "centralized" / "metrics.jsonl",
                                                ref / "local" / "metrics.jsonl", ref / "sklearn.json")}
    capsys.readouterr()
    assert main(["run", cfg, "--no-progress", "--reference", "--resume"]) == 0
    out = capsys.readouterr().out
    assert out.count("not retrained") == 2 and "not refitted" in out
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert main(["run", cfg, "--no-progress", "--resume"]) == 0  # the table may go on resume: no result changes
    assert "references" not in capsys.readouterr().out
    # more rounds: the references resume to them as well
    assert main(["run", cfg, "--no-progress", "--reference", "--resume", "--set", "rounds=3"]) == 0
    assert "centralized: centralized (resumed)" in capsys.readouterr().out
    assert len((ref / "centralized" / "metrics.jsonl").read_text().splitlines()) == 3


def test_flower_refuses_references_with_one_line(tmp_path, capsys):
    cfg = _text_toml(tmp_path)
    assert main(["flower", "simulate", cfg, "--reference"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: --reference:") and "simulation only" in err[0]
    with_table = _text_toml(tmp_path, reference={})
    assert main(["flower", "loopback", with_table]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: [reference]:")
    assert main(["flower", "run-config", with_table, "--set", "reference.enabled=false",
                 "-o", str(tmp_path / "rc.toml")]) == 0  # a disabled table passes


def test_personalized_family_compares_personalized_means(tmp_path):
    """FedAMP reports each client's model on its own test rows: the references report the same
    metric (local-only's personal/accuracy; centralized and LR on each client's rows)."""
    text_manifest(tmp_path)
    raw = text_config(tmp_path, text_encoder="hash:256")
    raw.update(rounds=1, algorithm={"name": "fedamp"})
    df = api.run(raw, reference=True, progress=False).reference
    assert set(df["metric"]) == {"personalized mean accuracy (each client's test rows)"}
    by = {r["method"]: r for r in df.to_dict("records")}
    local = [json.loads(x) for x in (tmp_path / "runs" / "tweets" / "reference" / "local" / "metrics.jsonl")
             .read_text().splitlines()]
    assert by["local-only"]["final"] == local[-1]["personal/accuracy"]  # not its shared-test-set accuracy
    assert "test accuracy" in by["logistic regression"]["note"]
    assert 0 <= by["centralized"]["final"] <= 1 and by["centralized"]["best"] != by["centralized"]["best"]  # NaN


def test_flattened_features_carry_missing_masks_as_0_1_columns():
    """present/<m> masks (per-sample missing modalities) are 0/1 columns; a test set without them
    counts the modality as present; a modality the test set lacks is zeros of its width."""
    import numpy as np
    import torch

    from mmfl.data.base import ArrayDataset
    from mmfl.reference_sklearn import flat_columns, training_matrix

    train = ArrayDataset({"a": torch.ones(4, 2, 3), "b": torch.arange(4.0)[:, None],
                          "present/a": torch.tensor([True, False, True, True])}, torch.tensor([0, 1, 0, 1]))
    X, y, keys, total = training_matrix(train, seed=0, max_rows=10)
    assert keys == ["a", "b", "present/a"] and X.shape == (4, 8) and total == 4
    assert X[:, -1].tolist() == [1, 0, 1, 1]
    test = ArrayDataset({"b": torch.zeros(2, 1)}, torch.tensor([0, 1]))
    Xt = flat_columns(test, keys, [6, 1, 1])
    assert Xt.shape == (2, 8) and np.all(Xt[:, :7] == 0) and np.all(Xt[:, 7] == 1)
    Xs, _, _, total = training_matrix(train, seed=0, max_rows=3)  # a seeded subset beyond max_rows
    assert Xs.shape == (3, 8) and total == 4


@pytest.mark.parametrize("path", sorted(__import__("glob").glob(str(
    __import__("pathlib").Path(__file__).resolve().parents[1] / "mmfl" / "configs" / "*.toml"))))
def test_every_packaged_config_has_valid_reference_configs(path, tmp_path):
    """The reference runs' configs of every packaged config resolve (the runs themselves: by hand,
    `mmfl run CONFIG --reference --set rounds=1`, docs/reference.md)."""
    from mmfl.reference import DROPPED, alone_table, centralized_table, child_config

    cfg = api.configure(path, output_dir=str(tmp_path))
    fam = family(ALGORITHMS.get(cfg.algorithm.name).factory)
    table = alone_table(cfg) if fam == "retrieval" else centralized_table(cfg)
    children = [child_config(cfg, "centralized", table)]
    if fam != "retrieval":
        children.append(child_config(cfg, "local", {"name": "local"}, sample_fraction=1.0, clients_per_round=0))
    for child in children:
        assert child.run.rounds == cfg.run.rounds and child.train == cfg.train
        assert (child.model.name, child.model.params) == (cfg.model.name, cfg.model.params)
        assert (child.data.name, child.data.params, child.partition.params) == \
            (cfg.data.name, cfg.data.params, cfg.partition.params)
        assert child.run_dir.parent == cfg.run_dir / "reference"
        assert all(getattr(child, k) is None for k in DROPPED)
