"""Modality heterogeneity: assignment, per-sample masks, cases A-D, module-wise aggregation,
clients that hold one modality, per-modality metrics."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from mmfl.algorithms.fedavg import weighted_average
from mmfl.config import load_config, resolve
from mmfl.data.base import PRESENT, ArrayDataset
from mmfl.data.modality import MODALITY_ASSIGNERS, missing_masks, modality_summary
from mmfl.data.federation import build_federation
from mmfl.core.training import class_recall
from mmfl.errors import ConfigError
from mmfl.report import load_metrics

from helpers import experiment, run_config

MODS = ["audio", "image"]


def assign(name, values, n=10, seed=0):
    params = MODALITY_ASSIGNERS.params(name, values)
    return MODALITY_ASSIGNERS.get(name).factory(params, MODS, n, np.random.default_rng(seed))


def test_mixed_half_multimodal_rest_split_evenly():
    holds = assign("mixed", {}, n=20)
    summary = modality_summary(holds)
    assert summary == {"audio": 5, "audio+image": 10, "image": 5}
    assert holds != assign("mixed", {}, n=20, seed=1)  # which clients: drawn from the seed
    assert holds == assign("mixed", {}, n=20, seed=0)


def test_mixed_random_split_and_fraction():
    holds = assign("mixed", {"multimodal_fraction": 0.25, "split": "random"}, n=8)
    assert sum(len(h) == 2 for h in holds) == 2
    assert all(len(h) in (1, 2) for h in holds)
    assert modality_summary(assign("mixed", {"multimodal_fraction": 0.0, "modalities": ["image"]}, n=4)) == {"image": 4}


def test_explicit_and_bad_values():
    assert assign("explicit", {"holds": [["image", "audio"], ["audio"]]}, n=2) == [("audio", "image"), ("audio",)]
    with pytest.raises(ConfigError, match="modalities.holds: has 1 entries for 2 clients"):
        assign("explicit", {"holds": [["image"]]}, n=2)
    with pytest.raises(ConfigError, match="unknown modality 'video'"):
        assign("mixed", {"modalities": ["video"]})
    with pytest.raises(ConfigError, match="missing_rate.image: must be in"):
        assign("all", {"missing_rate": {"image": 1.5}})
    with pytest.raises(ConfigError, match="multimodal_fraction"):
        assign("mixed", {"multimodal_fraction": 2.0})


def test_missing_masks_rate_and_never_all_missing():
    n = 400
    train = ArrayDataset({"audio": torch.zeros(n, 2), "image": torch.zeros(n, 3)}, torch.zeros(n, dtype=torch.long))
    parts = [np.arange(0, 200), np.arange(200, 300), np.arange(300, 400)]
    holds = [("audio", "image"), ("audio",), ("audio", "image")]
    masks = missing_masks(train, parts, holds, {"image": 0.5, "audio": 0.5}, np.random.default_rng(0))
    a, i = masks[PRESENT + "audio"].numpy(), masks[PRESENT + "image"].numpy()
    assert (a | i).all()  # no sample lost every modality
    assert a[200:300].all() and i[200:300].all()  # a unimodal client gets no masks
    # about half of each multimodal client's samples lack the image (a few restored where both went)
    assert 0.3 < 1 - i[:200].mean() <= 0.5
    assert missing_masks(train, parts, holds, {}, np.random.default_rng(0)) == {}


def test_cases_expand_and_conflict():
    cfg = resolve({"case": "D", "data": {"name": "mfeat", "views": ["pix", "fou"]}})
    assert (cfg.partition.name, cfg.partition.params.beta, cfg.modalities.name) == ("dirichlet", 5.0, "mixed")
    cfg = resolve({"case": "C", "partition": {"beta": 0.5}})
    assert cfg.partition.params.beta == 0.5  # explicit values win over the preset's
    assert resolve({"case": "A"}).partition.name == "iid"
    with pytest.raises(ConfigError, match="case B needs 'iid'"):
        resolve({"case": "B", "partition": {"name": "dirichlet"}})
    with pytest.raises(ConfigError, match="case: must be one of"):
        resolve({"case": "E"})


# ----------------------------------------------------------------------------- module-wise aggregation


def test_module_aggregation_skips_clients_without_the_module_and_weights_by_data():
    enc_a = {"encoders.image.w": torch.tensor([1.0]), "classifier.w": torch.tensor([1.0])}
    enc_b = {"classifier.w": torch.tensor([4.0])}  # holds no image: sends no image encoder
    enc_c = {"encoders.image.w": torch.tensor([4.0]), "classifier.w": torch.tensor([7.0])}
    previous = {"encoders.image.w": torch.tensor([0.0]), "encoders.audio.w": torch.tensor([9.0]),
                "classifier.w": torch.tensor([0.0])}
    out = weighted_average([enc_a, enc_b, enc_c], [1.0, 2.0, 3.0], previous=previous)
    assert out["encoders.image.w"].item() == pytest.approx((1 * 1 + 3 * 4) / 4)  # over a and c only
    assert out["classifier.w"].item() == pytest.approx((1 * 1 + 2 * 4 + 3 * 7) / 6)
    assert out["encoders.audio.w"].item() == 9.0  # nobody sent it: keeps its value
    # per-module weights: a's image encoder counts 3 samples (of its 10), c's 1
    out = weighted_average([enc_a, enc_c], [{"": 10, "encoders.image.": 3}, {"": 10, "encoders.image.": 1}],
                           previous=previous)
    assert out["encoders.image.w"].item() == pytest.approx((3 * 1 + 1 * 4) / 4)
    assert out["classifier.w"].item() == pytest.approx(4.0)
    # a module whose senders all weigh 0 keeps its previous value
    out = weighted_average([enc_a], [{"": 5, "encoders.image.": 0}], previous=previous)
    assert out["encoders.image.w"].item() == 0.0


def test_class_recall():
    pred = torch.tensor([0, 0, 1, 2, 2])
    y = torch.tensor([0, 1, 1, 2, 0])
    assert class_recall(pred, y, 4) == [0.5, 0.5, 1.0, None]


# ----------------------------------------------------------------------------- end to end


def mm_config(tmp_path, algorithm="mfedavg", **extra):
    raw = {"name": algorithm, "rounds": 2, "output_dir": str(tmp_path), "threads": 1, "case": "D",
           "data": {"name": "mfeat", "views": ["pix", "fou"]},
           "partition": {"num_clients": 4},
           "modalities": {"missing_rate": {"fou": 0.2}},
           "model": {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [32], "two_projector": algorithm == "fedcmi"},
           "algorithm": {"name": algorithm},
           "train": {"local_epochs": 1, "batch_size": 64}}
    raw.update(extra)
    return resolve(raw)


def test_unimodal_clients_build_only_their_encoders_train_and_upload_only_them(tmp_path):
    cfg = mm_config(tmp_path)
    fed = build_federation(cfg)
    holds = fed.client_modalities
    assert modality_summary(holds) == {"fou": 1, "pix+fou": 2, "pix": 1}
    uni = holds.index(("pix",))
    assert fed.clients[uni].modalities == ["pix"]  # its data carries only its modality
    exp = experiment(cfg)
    summary = exp.run()
    rows = load_metrics(tmp_path / "mfedavg")
    last = rows[-1]
    for key in ("accuracy", "accuracy/pix", "accuracy/fou", "uar", "uar/pix"):
        assert 0.0 <= last[key] <= 1.0
    assert len(last["class_accuracy/pix"]) == 10
    assert summary["final_accuracy"] == last["accuracy"]
    assert summary["final_accuracy/pix"] == last["accuracy/pix"] and summary["final_uar"] == last["uar"]
    assert summary["final_class_accuracy/fou"] == last["class_accuracy/fou"]  # what `mmfl run` prints
    # the unimodal client's model has no fou branch, and it uploads no fou module
    model = exp.transport._model("local", ("pix",))
    assert not any(".fou." in k for k in model.state_dict())
    from mmfl.core.message import Message

    msg = exp.server.configure_train(0, [uni])[uni]
    assert not any(".fou." in k for k in msg.arrays) and any(".pix." in k for k in msg.arrays)
    full = exp.server.configure_train(0, [holds.index(("pix", "fou"))])
    assert any(".fou." in k for k in next(iter(full.values())).arrays)
    assert isinstance(msg, Message)


def test_single_modality_model_rejects_partial_clients(tmp_path):
    cfg = mm_config(tmp_path, "fedavg", model={"name": "mlp"})
    with pytest.raises(ConfigError, match="needs every modality on every client"):
        experiment(cfg)


def test_multimodal_algorithm_needs_multimodal_model(tmp_path):
    cfg = mm_config(tmp_path, case="A", model={"name": "mlp"})
    with pytest.raises(ConfigError, match="needs model.name = \"multimodal\""):
        experiment(cfg)


def test_load_config_case_from_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('case = "B"\n[data]\nname = "mfeat"\nviews = ["pix", "fou"]\n[partition]\nnum_clients = 4\n')
    cfg = load_config(p)
    assert (cfg.partition.name, cfg.modalities.name) == ("iid", "mixed")
    assert "case" not in cfg.to_dict()  # expanded into the tables the run folder saves


def test_local_training_of_unimodal_clients_evaluates_on_the_multimodal_test_set(tmp_path):
    cfg = mm_config(tmp_path, "local", eval_every=2)
    run_config(cfg)
    last = load_metrics(tmp_path / "local")[-1]
    assert len(last["client_accuracy"]) == 4 and all(0.0 <= a <= 1.0 for a in last["client_accuracy"])


# ----------------------------------------------------------------------------- [[client_models]]


def test_client_models_give_clients_their_own_architecture(tmp_path):
    cfg = mm_config(tmp_path, "local", eval_every=2,
                    client_models=[{"for_clients": [0, 1], "feat_dim": 8},
                                   {"for_modalities": ["pix"], "mlp_hidden": [8]}])
    exp = experiment(cfg)
    fed = exp.federation
    assert fed.client_groups[:2] == [0, 0]
    held = fed.client_modalities
    for c in range(2, 4):
        assert fed.client_groups[c] == (1 if held[c] == ("pix",) else None)
    exp.run()
    widths = {}
    for c in range(4):
        model = exp.transport._model("local", held[c] if held[c] != ("pix", "fou") else None, fed.group_of(c))
        widths[c] = model.classifier.in_features
    assert widths[0] == widths[1] == 2 * 8  # concat of two 8-d slots
    assert all(widths[c] == 2 * 16 for c in (2, 3))
    saved = (tmp_path / "local" / "config.toml").read_text()
    assert "for_clients = [" in saved and "[[client_models]]" in saved
    resumed = experiment({**cfg.to_dict()})  # the saved form resolves again
    assert resumed.federation.client_groups == fed.client_groups


def test_client_models_bad_entries():
    with pytest.raises(ConfigError, match=r"client_models\[0\]: select clients"):
        resolve({"client_models": [{"feat_dim": 8}]})
    with pytest.raises(ConfigError, match=r"client_models\[0\]: model.hidden"):
        resolve({"model": {"name": "mlp"}, "client_models": [{"for_clients": [0], "hidden": [-1]}]})
    with pytest.raises(ConfigError, match=r"client_models\[0\].for_clients"):
        resolve({"client_models": [{"for_clients": "0-3"}]})


# ----------------------------------------------------------------------------- [[client_data]], public set


def test_client_data_adds_clients_from_another_data_set_with_their_own_model(tmp_path):
    raw = {"name": "src", "rounds": 2, "eval_every": 2, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "digits"}, "partition": {"name": "iid", "num_clients": 2},
           "model": {"name": "mlp", "hidden": [32]}, "algorithm": {"name": "local"},
           # another split of the same images (a [[client_data]] set shares [data]'s modalities and shapes)
           "client_data": [{"data": {"name": "digits", "test_fraction": 0.5},
                            "partition": {"name": "iid", "num_clients": 3}}],
           "client_models": [{"for_clients": [2, 3, 4], "hidden": [16]}],
           "train": {"local_epochs": 1}}
    cfg = resolve(raw)
    exp = experiment(cfg)
    fed = exp.federation
    assert fed.num_clients == 5 and fed.client_sources == [None, None, 0, 0, 0]
    assert fed.meta_of(3).name == "digits" and fed.clients[3].modalities == ["image"]
    assert fed.modalities_of(0) == ("image",) and fed.modalities_of(4) == ("image",)
    assert len(fed.test_of(4)) == len(fed.sources[0].test) != len(fed.test)
    exp.run()
    last = load_metrics(tmp_path / "src")[-1]
    assert len(last["client_accuracy"]) == 5
    digits_model = exp.transport._model("local", None, 0, 0, fed.meta_of(2))
    assert digits_model.features[0].in_features == 64 and digits_model.features[0].out_features == 16
    assert exp.transport._model("local").features[0].out_features == 32  # [model]
    assert resolve(cfg.to_dict()).client_data[0].partition.params.num_clients == 3  # saved form resolves


def test_client_data_bad_entries():
    with pytest.raises(ConfigError, match=r"client_data\[0\].data: must be a table with a name"):
        resolve({"client_data": [{"partition": {"name": "iid"}}]})
    with pytest.raises(ConfigError, match=r"client_data\[0\]: unknown dataset 'nope'|client_data\[0\].*nope"):
        resolve({"client_data": [{"data": {"name": "nope"}, "partition": {"name": "iid"}}]})
    with pytest.raises(ConfigError, match=r"client_data\[0\].model: unknown key"):
        resolve({"client_data": [{"data": {"name": "digits"}, "partition": {"name": "iid"}, "model": {}}]})


def test_clients_see_the_public_set():
    from mmfl.algorithms.base import AlgorithmSpec, Client
    from mmfl.config import TrainConfig
    from mmfl.data.base import DatasetMeta
    from mmfl.engine.client_runtime import run_client
    from mmfl.core.message import Message

    class Peek(Client):
        def train(self, msg):
            return Message(scalars={"public": float(len(self.ctx.public))})

    public = ArrayDataset({"image": torch.zeros(7, 2)}, torch.zeros(7, dtype=torch.long))
    data = ArrayDataset({"image": torch.zeros(3, 2)}, torch.zeros(3, dtype=torch.long))
    reply, _ = run_client(AlgorithmSpec(None, Peek), None, cid=0, rnd=0, route="train", call=0, msg=Message(),
                          data=data, test_data=None, meta=DatasetMeta("t", 2, {"image": (2,)}),
                          train=TrainConfig(), seed=0, state={}, model_pool=None, init_model=None, public=public)
    assert reply.scalars["public"] == 7.0


def test_server_sees_the_public_set(tmp_path, monkeypatch):
    from mmfl.data import DATASETS
    from mmfl.data.base import DatasetBundle

    entry = DATASETS.get("digits")
    real = entry.factory

    def with_public(params):
        b = real(params)
        return DatasetBundle(b.train, b.test, b.meta, public=b.test.subset(range(5)))

    import dataclasses

    monkeypatch.setitem(DATASETS._entries, "digits", dataclasses.replace(entry, factory=with_public))
    cfg = resolve({"name": "p", "output_dir": str(tmp_path), "data": {"name": "digits"},
                   "partition": {"name": "iid", "num_clients": 2}, "model": {"name": "mlp"}})
    exp = experiment(cfg)
    assert len(exp.server.ctx.public) == 5 and exp.federation.public is exp.server.ctx.public
