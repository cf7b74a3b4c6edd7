"""[tracking] on a short multimodal run of every family (FedCMI: per-modality accuracies next to
``accuracy``; CreamFL: retrieval metrics; PartialFL; pfedwireless: personalized metrics): MLflow's
run ends FINISHED with every number of metrics.jsonl (read back with MlflowClient, under the names
of :func:`mmfl.engine.tracking.mlflow_names`), W&B's offline file has them, TensorBoard's events
have them. Before the name rule, MLflow's file store failed at round 1 of every multimodal run
(``accuracy`` a file, ``accuracy/<m>`` under a folder of the same name)."""

import json

import pytest

from mmfl.engine.tracking import mlflow_names, scalars

from helpers import rows, run_config

pytest.importorskip("tensorboard", reason="the tracking extra is not installed: pip install 'mmfl[tracking]'")
pytest.importorskip("mlflow", reason="the tracking extra is not installed: pip install 'mmfl[tracking]'")
pytest.importorskip("wandb", reason="the tracking extra is not installed: pip install 'mmfl[tracking]'")

try:
    from test_tracking import expected, tb_scalars, wandb_core_children, wandb_history
except ImportError:  # run as the package tests.*
    from tests.test_tracking import expected, tb_scalars, wandb_core_children, wandb_history

ALL = ["tensorboard", "mlflow", "wandb"]
TRAIN = {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.001}
PAIR_MODEL = {"name": "multimodal", "feat_dim": 16, "cnn_channels": [4], "mlp_hidden": [32]}

FAMILIES = {
    "fedcmi": {"data": {"name": "mfeat", "views": ["pix", "fou"]}, "partition": {"num_clients": 3},
               "modalities": {"name": "explicit", "holds": [["pix", "fou"], ["pix"], ["fou"]]},
               "model": {"name": "multimodal", "feat_dim": 8, "mlp_hidden": [16], "two_projector": True},
               "algorithm": {"name": "fedcmi"}},
    "creamfl": {"data": {"name": "mfeat_pair", "public_fraction": 0.3},
                "partition": {"name": "iid", "num_clients": 3},
                "modalities": {"name": "explicit", "holds": [["image", "features"], ["image"], ["features"]]},
                "model": PAIR_MODEL, "algorithm": {"name": "creamfl", "server_batch_size": 64}},
    "partialfl": {"data": {"name": "mfeat_pair"}, "partition": {"name": "iid", "num_clients": 3},
                  "modalities": {"name": "explicit", "holds": [["image", "features"], ["image", "features"],
                                                               ["image"]]},
                  "model": PAIR_MODEL, "algorithm": {"name": "partialfl", "shareable": "features"}},
    "pfedwireless": {"data": {"name": "mfeat", "views": ["pix", "fou", "kar"]},
                     "partition": {"num_clients": 6}, "modalities": {"name": "mixed"},
                     "model": {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [32]},
                     "algorithm": {"name": "pfedwireless"}},
}
# a key of each family's rows that the test must see logged (what made it a family of its own)
MARK = {"fedcmi": "accuracy/pix", "creamfl": "i2t_r1", "partialfl": "accuracy", "pfedwireless": "accuracy_std"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_run(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(name)
    raw = {"name": name, "rounds": 2, "seed": 0, "output_dir": str(out), "threads": 1, "train": dict(TRAIN),
           "tracking": {"backends": ALL}, **json.loads(json.dumps(FAMILIES[name]))}
    exp = run_config(raw, overwrite=True)
    return name, exp.run_dir


def test_mlflow_run_finishes_with_every_metric(family_run):
    from mlflow.tracking import MlflowClient

    name, d = family_run
    state = json.loads((d / "tracking.json").read_text())[f"mlflow:{(d / 'mlruns').resolve()}"]
    client = MlflowClient(tracking_uri=(d / "mlruns").resolve().as_uri())
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED"
    want = expected(d)
    assert MARK[name] in want
    names = mlflow_names(want, dict(state["names"]))
    assert len(set(names.values())) == len(names)
    assert names == {k: state["names"][k] for k in want}  # the names the run used, recorded for the user
    for key, by_round in want.items():
        hist = client.get_metric_history(state["run_id"], names[key])
        assert sorted((m.step, m.value) for m in hist) == sorted(by_round.items()), key
    summary = json.loads((d / "summary.json").read_text())
    for k, v in scalars(summary).items():
        assert run.data.metrics[state["names"][f"summary/{k}"]] == pytest.approx(v), k


def test_wandb_offline_and_tensorboard_have_every_metric(family_run):
    name, d = family_run
    want = expected(d)
    rounds = [r["round"] for r in rows(d)]
    history, _, _ = wandb_history(d)
    assert [h["round"] for h in history] == rounds
    got = tb_scalars(d / "tb")
    for key, by_round in want.items():
        assert [h.get(key) for h in history if h["round"] in by_round] == pytest.approx(
            [by_round[r] for r in sorted(by_round)]), key
        assert got[key] == [(s, pytest.approx(v, rel=1e-6)) for s, v in sorted(by_round.items())], key
    assert wandb_core_children() == []


def test_mlflow_names_no_name_is_a_folder_of_another_and_names_are_stable():
    given: dict = {}
    row = ["accuracy", "accuracy/pix", "uar", "uar/pix", "bytes_by_route/train/up", "pattern/complete/accuracy",
           "pattern/no_audio/n", "personal/accuracy", "personal/accuracy/pix", "recall@1", "a/b/c"]
    names = mlflow_names(row, given)
    assert names["accuracy"] == "accuracy" and names["accuracy/pix"] == "accuracy.pix"
    assert names["uar/pix"] == "uar.pix" and names["bytes_by_route/train/up"] == "bytes_by_route/train/up"
    assert names["pattern/complete/accuracy"] == "pattern/complete/accuracy"
    assert names["personal/accuracy/pix"] == "personal/accuracy.pix" and names["recall@1"] == "recall_1"
    # a metric that first appears after its sub-metrics were stored: a name of its own, the others keep theirs
    late = mlflow_names(["a/b", "a/b/c"], given)
    assert late == {"a/b": "a.b", "a/b/c": "a/b/c"}
    every = list(given.values())
    for n in every:
        assert not any(o != n and (o.startswith(n + "/") or o == n) for o in every), n
    assert mlflow_names(row, dict(given)) == names  # the same names on resume
