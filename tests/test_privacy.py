"""Privacy rules ([privacy], mmfl.engine.privacy): the checker on hand-made replies (what
it catches, and what it must let through), the config table, and runs in which a
deliberately leaking client fails the run, in the simulator (sequential and batched) and
through the Flower ClientApp."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.config import PrivacyConfig, load_config, resolve
from mmfl.data.base import ArrayDataset
from mmfl.core.message import Message
from mmfl.engine.privacy import PrivacyChecker, PrivacyError, label_named, make_checker
from mmfl.engine.runner import Experiment
from mmfl.engine.simulation import SimulationTransport
from mmfl.errors import ConfigError, MMFLError

from helpers import config, experiment, run_config

C = 10  # classes


def dataset(n: int = 400, seed: int = 0) -> ArrayDataset:
    """A shared train set: "image" [1, 4, 5] (private in the tests), "audio" [12], labels."""
    g = torch.Generator().manual_seed(seed)
    return ArrayDataset({"image": torch.randn(n, 1, 4, 5, generator=g), "audio": torch.randn(n, 12, generator=g)},
                        torch.randint(0, C, (n,), generator=g))


SHARED = dataset()
CLIENT = SHARED.subset(torch.arange(0, 400, 2))  # client 3's view: the even rows
OTHER = SHARED.subset(torch.arange(1, 400, 2))  # another client's rows
RULES = PrivacyConfig(modalities={"image": "private", "audio": "shareable"})


def violation(arrays=None, scalars=None, rules=RULES, data=CLIENT):
    return PrivacyChecker(rules).violation(Message(arrays=arrays or {}, scalars=scalars or {}), data, C)


def mine():
    feats, y = CLIENT.get()
    return feats["image"], feats["audio"], y


# ----------------------------------------------------------------------------- raw data of a private modality

def test_private_rows_are_found_permuted_subset_reshaped_or_among_other_rows():
    x, _, _ = mine()
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(len(x), generator=g)
    noise = torch.randn(50, 1, 4, 5, generator=g)
    leaks = {
        "whole": x,
        "permuted_subset": x[perm[:7]],
        "one_row_among_others": torch.cat([noise[:20], x[[13]], noise[20:]]),
        "flat_rows": x[perm[:5]].reshape(5, 20),
        "flattened": torch.cat([noise.flatten(), x[[3, 4]].flatten()]),
        "transposed": x[:9].reshape(9, 20).t(),
        "float64": x[:3].double(),
        "stacked_3d": x[:8].reshape(2, 4, 20),
    }
    for name, t in leaks.items():
        assert violation({"w": torch.randn(8, 20), name: t}) == \
            f"array '{name}' carries private modality 'image' raw data (privacy.modalities.image = \"private\")", name


def test_other_clients_rows_shareable_modality_and_uninformative_rows_pass():
    _, audio, _ = mine()
    other = OTHER.get()[0]["image"]
    assert violation({"x": other}) is None  # another client's samples are not this client's data
    assert violation({"a": audio}) is None  # audio is shareable
    assert violation({"x": other[:5] + 1e-6}) is None
    # an all-zero sample is not indexed: zero rows (biases, untouched gradients) never match
    zero = ArrayDataset({"image": torch.zeros(4, 1, 4, 5), "audio": torch.randn(4, 12)}, torch.arange(4))
    assert violation({"b": torch.zeros(3, 20)}, data=zero) is None


def test_samples_the_client_lacks_are_not_its_data():
    data = ArrayDataset({**SHARED.features, "present/image": torch.arange(400) % 4 != 0}, SHARED.labels)
    view = data.subset(torch.arange(0, 400, 2))
    x = view.get()[0]["image"]
    assert violation({"x": x[[0]]}, data=view) is None  # row 0 (shared row 0): present/image False
    assert "raw data" in violation({"x": x[[1]]}, data=view)  # row 1 (shared row 2): present


def test_unlisted_modalities_follow_the_default_rule():
    x, audio, _ = mine()
    only_image = PrivacyConfig(modalities={"image": "shareable"})  # audio: default "private"
    assert violation({"a": audio[:2]}, rules=only_image) == \
        "array 'a' carries private modality 'audio' raw data (privacy.default = \"private\")"
    assert violation({"x": x}, rules=only_image) is None
    assert violation({"a": audio, "x": x}, rules=PrivacyConfig(default="shareable")) is None


# ----------------------------------------------------------------------------- labels

def test_labels_are_found_in_order_permuted_subset_one_hot_and_named_scalars():
    _, _, y = mine()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(2))
    cases = {
        "in_order": (y, "in order"),
        "as_float": (y.float(), "in order"),
        "column": (y[:, None].clone(), "in order"),
        "permuted": (y[perm], "permuted or a subset"),
        "subset": (y[perm[: int(0.6 * len(y))]].int(), "permuted or a subset"),
        "one_hot": (F.one_hot(y, C).float(), "one-hot, in order"),
        "one_hot_permuted": (F.one_hot(y[perm], C).to(torch.uint8), "one-hot, permuted or a subset"),
    }
    for name, (t, how) in cases.items():
        assert violation({"w": torch.randn(4, 4), name: t}) == \
            f"array '{name}' carries the client's labels ({how}; privacy.labels = \"private\")", name
    # one shuffled batch is too few rows to tell by content; named like labels, it is labels
    assert violation({"labels": y[perm[:8]]}) == ("array 'labels' carries the client's labels (a label-named "
                                                  "array of the client's classes; privacy.labels = \"private\")")
    assert violation({"sl/y": F.one_hot(y[perm[:8]], C)}) is not None
    assert violation({"labels": y[perm[:2]]}) is not None  # a batch's last two rows
    assert violation({"labels": torch.tensor([C, 0])}) is None  # not class ids
    for name in ("label", "labels/3", "y", "batch.target", "label_7"):
        assert violation(scalars={"num_examples": 200, name: 3}) == \
            f"scalar '{name}' is named like a label (privacy.labels = \"private\")"


def test_label_rules_off_when_labels_are_shareable():
    _, _, y = mine()
    rules = PrivacyConfig(modalities={"image": "private"}, labels="shareable", default="shareable")
    assert violation({"y": y, "hot": F.one_hot(y, C)}, {"label": 1}, rules=rules) is None


def test_weights_embeddings_counts_and_histograms_pass():
    x, audio, y = mine()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, C))
    bn = nn.BatchNorm1d(32)
    bn(torch.randn(8, 32))  # num_batches_tracked = 1: an integer tensor
    arrays = {f"model/{k}": v for k, v in {**model.state_dict(), **bn.state_dict()}.items()}
    reps = F.normalize(nn.Linear(12, 16)(audio), dim=1).detach()  # representations of the shareable modality
    hist = torch.bincount(y, minlength=C)
    arrays.update({
        "reps": reps,
        "logits": model(x).detach(),  # the private modality, as the model sees it: not raw data
        "class_counts": hist,
        "class_counts_float": hist.float(),
        "proto_count": torch.stack([hist, hist // 2]).float(),  # per modality and class [2, C]
        "proto": torch.randn(C, 16),
        "zero_bias": torch.zeros(len(y)),  # constant: not labels even where every label could be 0
        "steps": torch.tensor([3, 1, 2]),  # fewer than MIN_LABEL_ROWS values
        "one_batch": y[:8],  # 8 of 200 labels: below the share that makes a subset count
        "seen": hist > 0,
    })
    scalars = {"num_examples": len(y), "train_loss": 0.5, "steps": 4, "examples/encoders.image.": len(y),
               "num_modalities": 2, "accuracy/image": 0.5, "class_accuracy": 0.25, "tag": "labelled"}
    assert violation(arrays, scalars) is None
    assert not any(label_named(k) for k in scalars)


def test_a_client_of_one_class_or_a_histogram_vector_is_not_label_checked():
    one = ArrayDataset({"audio": torch.randn(20, 12)}, torch.full((20,), 4))
    assert violation({"v": torch.full((20,), 4)}, data=one) is None  # equals its histogram's information
    assert violation({"y": torch.full((20,), 4)}, data=one) is not None  # but not under a label's name
    tiny = ArrayDataset({"audio": torch.randn(10, 12)}, torch.arange(10))
    assert violation({"counts": torch.bincount(torch.arange(10), minlength=C)}, data=tiny) is None
    assert violation({"v": torch.arange(10)}, data=tiny) is not None  # in order: still labels


def test_check_raises_one_line_error_naming_client_route_array_rule():
    rules = PrivacyConfig(modalities={"audio": "private", "image": "shareable"})
    _, audio, _ = mine()
    with pytest.raises(PrivacyError) as e:
        PrivacyChecker(rules).check(Message(arrays={"x": audio[5:9]}), CLIENT, cid=3, route="train", num_classes=C)
    assert isinstance(e.value, MMFLError)
    assert str(e.value) == ("client 3, route train: array 'x' carries private modality 'audio' raw data "
                            "(privacy.modalities.audio = \"private\")")


def test_thousands_of_rows_are_indexed_once_and_checked_by_hash():
    big = ArrayDataset({"image": torch.randn(6000, 3, 16, 16)}, torch.randint(0, C, (6000,)))
    view = big.subset(torch.arange(5000))
    checker = PrivacyChecker(PrivacyConfig())
    weights = {"enc.weight": torch.randn(64, 768), "head.weight": torch.randn(C, 64)}
    assert checker.violation(Message(arrays=weights), view, C) is None
    assert len(checker._rows) == 1  # the client's rows: hashed once, reused by later replies
    assert checker.violation(Message(arrays={"x": big.features["image"][[4999]]}), view, C) is not None
    assert checker.violation(Message(arrays={"x": big.features["image"][[5000]]}), view, C) is None


# ----------------------------------------------------------------------------- config

def test_privacy_table_resolves_round_trips_and_is_off_when_absent():
    cfg = load_config(None, ['privacy.modalities={image = "private", features = "shareable"}'])
    assert cfg.privacy == PrivacyConfig(modalities={"image": "private", "features": "shareable"},
                                        labels="private", default="private")
    again = resolve(__import__("tomllib").loads(cfg.to_toml()))
    assert again.to_dict() == cfg.to_dict() and again.privacy == cfg.privacy
    assert cfg.to_dict()["privacy"] == {"modalities": {"image": "private", "features": "shareable"},
                                        "labels": "private", "default": "private"}
    plain = load_config(None, [])
    assert plain.privacy is None and "privacy" not in plain.to_dict()
    assert load_config(None, ["privacy.labels=shareable"]).privacy == PrivacyConfig(labels="shareable")


@pytest.mark.parametrize("override, message", [
    ('privacy.modalities={image = "secret"}',
     'privacy.modalities.image: must be "shareable" or "private", got \'secret\''),
    ("privacy.labels=public", "privacy.labels: must be one of ['shareable', 'private'], got 'public'"),
    ("privacy.label=private", "privacy.label: unknown key"),
    ("privacy.modalities=3", "privacy.modalities: must be a table"),
])
def test_bad_privacy_tables_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_rules_naming_a_modality_the_data_set_lacks_fail_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match=r"^privacy.modalities.audio: unknown modality 'audio' "
                                          r"\(data set has: image, features\)$"):
        make_checker(PrivacyConfig(modalities={"audio": "private"}), ["image", "features"])
    cfg = tiny_config(tmp_path, "bad", 'privacy.modalities={audio = "private"}')
    with pytest.raises(ConfigError, match="privacy.modalities.audio: unknown modality"):
        experiment(cfg, transport=simulation_with_privacy)


# ----------------------------------------------------------------------------- runs

TINY = ["data.name=mfeat_pair", "partition.num_clients=2", "partition.name=iid", "model.name=multimodal",
        "model.feat_dim=8", "model.cnn_channels=[4]", "model.mlp_hidden=[16]", "algorithm.name=mfedavg",
        "train.local_epochs=1", "train.batch_size=128", "threads=1", "rounds=1",
        'privacy.modalities={image = "private", features = "private"}']


def tiny_config(tmp_path, name, *over, base=TINY):
    return config(tmp_path, name, *over, base=base, rounds=None)


def simulation_with_privacy(e: Experiment) -> SimulationTransport:
    """The simulator as Experiment builds it, with the run's [privacy] rules."""
    cfg = e.cfg
    from mmfl.core.training import train_for_run

    return SimulationTransport(e.spec, cfg.algorithm.params, e.federation, train_for_run(cfg.train, cfg.run.rounds),
                               cfg.run.seed, e.make_model,
                               e.store, on_nonfinite=cfg.run.on_nonfinite, batch_clients=cfg.run.batch_clients,
                               privacy=cfg.privacy)


def leak(monkeypatch, cls, method: str, what: str):
    """Make ``cls.method`` add the client's raw image rows or its labels to its reply."""
    original = getattr(cls, method)

    def leaky(self, *args):
        reply = original(self, *args)
        feats, y = self.ctx.data.get()
        if what == "image":
            reply.arrays["debug/x"] = feats["image"][:2]
        else:
            reply.arrays["debug/y"] = y.float()
        return reply

    monkeypatch.setattr(cls, method, leaky)


def test_a_run_within_the_rules_passes_with_the_same_bytes(tmp_path):
    from mmfl.report import load_metrics

    exp = experiment(tiny_config(tmp_path, "ok"), transport=simulation_with_privacy)
    assert exp.transport.privacy is not None
    exp.run()
    plain = tiny_config(tmp_path, "plain")
    plain.privacy = None
    run_config(plain, transport=simulation_with_privacy)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rows]  # noqa: E731
    assert strip(load_metrics(tmp_path / "ok")) == strip(load_metrics(tmp_path / "plain"))


@pytest.mark.parametrize("what, message", [
    ("image", r"^client 0, route train: array 'debug/x' carries private modality 'image' raw data "
              r"\(privacy.modalities.image = \"private\"\)$"),
    ("labels", r"^client 0, route train: array 'debug/y' carries the client's labels \(in order; "
               r"privacy.labels = \"private\"\)$"),
])
def test_a_leaking_client_fails_the_run_with_one_line(tmp_path, monkeypatch, what, message):
    from mmfl.algorithms.multimodal import MFedAvgClient

    leak(monkeypatch, MFedAvgClient, "train", what)
    exp = experiment(tiny_config(tmp_path, what), transport=simulation_with_privacy)
    with pytest.raises(PrivacyError, match=message):
        exp.run()
    # the same leak is allowed where the rules allow it
    allow = ['privacy.modalities={image = "shareable", features = "private"}', "privacy.labels=shareable",
             'on_no_valid_reply="skip"']  # the check lets it leave; the server's schema then drops the extra array
    run_config(tiny_config(tmp_path, what + "-allowed", *allow), transport=simulation_with_privacy)


@pytest.mark.parametrize("near", [False, True])
def test_labels_sent_as_scalars_beside_num_examples_fail_the_run(tmp_path, monkeypatch, near):
    """Issue 27: a client that adds its labels to the reply scalars, where the required
    ``num_examples`` (already in the reply) sits before them, and later a loss; ``near``: one
    label changed too. The run stops with one line; nothing reaches the server."""
    from mmfl.algorithms.multimodal import MFedAvgClient

    original = MFedAvgClient.train

    def leaky(self, *args):
        reply = original(self, *args)
        y = self.ctx.data.get()[1].tolist()
        if near:
            y[0] = (y[0] + 1) % 10
        reply.scalars.update({"s" + "".join(chr(97 + i // 26 ** p % 26) for p in (2, 1, 0)): float(v)
                              for i, v in enumerate(y)})  # names with no number: no name family
        reply.scalars["train_loss_again"] = 0.5
        return reply

    monkeypatch.setattr(MFedAvgClient, "train", leaky)
    exp = experiment(tiny_config(tmp_path, f"scalars{near}"), transport=simulation_with_privacy)
    with pytest.raises(PrivacyError, match=r"^client 0, route train: the \d+ numeric scalars .* carries the "
                                           r"client's labels \("):
        exp.run()


def test_batched_replies_are_checked_too(tmp_path, monkeypatch):
    from mmfl.algorithms.fedavg import FedAvgClient

    base = ["data.name=mfeat", 'data.views=["fou", "kar"]', "partition.num_clients=3", "model.name=mlp",
            "model.hidden=[16]", "algorithm.name=fedavg", "batch_clients=true", "privacy.labels=private",
            "train.local_epochs=1", "train.batch_size=128", "threads=1", "rounds=1", 'train.optimizer="sgd"']
    leak(monkeypatch, FedAvgClient, "batched_finish", "labels")  # only the batched path leaks
    exp = experiment(tiny_config(tmp_path, "batched", base=base), transport=simulation_with_privacy)
    with pytest.raises(PrivacyError, match=r"^client 0, route train: array 'debug/y' carries the client's labels"):
        exp.run()


def test_the_default_experiment_transport_enforces_the_rules(tmp_path, monkeypatch):
    from mmfl.algorithms.multimodal import MFedAvgClient

    exp = experiment(tiny_config(tmp_path, "default"))
    assert getattr(exp.transport, "privacy", None) is not None
    leak(monkeypatch, MFedAvgClient, "train", "image")
    with pytest.raises(PrivacyError, match="carries private modality 'image' raw data"):
        exp.run()


def test_the_flower_client_app_checks_replies_before_they_leave(tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    from mmfl.algorithms.multimodal import MFedAvgClient
    from mmfl.flower.transport import FlowerTransport

    try:
        from test_flower import InProcessGrid
    except ImportError:  # run as the package tests.*
        from tests.test_flower import InProcessGrid

    def grid_run(name):
        cfg = tiny_config(tmp_path, name)
        grid = InProcessGrid(cfg.to_toml(), {11: {"partition-id": 0, "num-partitions": 2},
                                             22: {"partition-id": 1, "num-partitions": 2}})
        run_config(cfg, transport=lambda e: FlowerTransport(grid, e.federation, cfg.run,
                                                            wait_for_nodes_s=0))

    grid_run("flower-ok")
    leak(monkeypatch, MFedAvgClient, "train", "labels")
    with pytest.raises(PrivacyError, match=r"^client 0, route train: array 'debug/y' carries the client's labels"):
        grid_run("flower-leak")  # raised by the ClientApp's handle (a SuperNode: an error reply, the run fails)
