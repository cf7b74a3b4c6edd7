"""Sequence and token encoders of the multimodal model (mmfl.models.sequence): padded steps
change no embedding, the automatic choice keeps the models of existing shapes, and the
``length/<m>`` keys reach the encoders through data views, personal evaluation, split
learning and a FedCMI run."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from mmfl.algorithms.split_cut import client_forward
from mmfl.core.personal import held_test_set
from mmfl.data import DATASETS
from mmfl.data.base import LENGTH, PRESENT, ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import build_model
from mmfl.models.multimodal import CNNEncoder, MLPEncoder, MultimodalModel, default_encoder
from mmfl.models.sequence import Conv1dEncoder, GRUEncoder, TokenEncoder
from mmfl.registry import Entry

from helpers import config, run_config

torch.set_num_threads(1)


def _padded(x: torch.Tensor, lengths, fill: float) -> torch.Tensor:
    """``x`` [B, C, T] with the steps at or after ``lengths[b]`` set to ``fill``."""
    out = x.clone()
    for b, n in enumerate(lengths):
        out[b, ..., n:] = fill
    return out


@pytest.mark.parametrize("make", [lambda: Conv1dEncoder((3, 20), [8, 8], 6, kernel=5),
                                  lambda: Conv1dEncoder((3, 20), [8, 8, 8], 6, kernel=3),
                                  lambda: GRUEncoder((3, 20), 8, 6)])
def test_sequence_encoder_output_ignores_values_at_padded_steps(make):
    torch.manual_seed(0)
    enc = make()
    lengths = torch.tensor([20, 7, 1, 13])
    x = torch.randn(4, 3, 20)
    a = enc(_padded(x, lengths, 0.0), lengths)
    b = enc(_padded(x, lengths, 5.0), lengths)
    c = enc(torch.where(torch.arange(20) < lengths[:, None, None], x, 4 * torch.randn(4, 3, 20)), lengths)
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(a, c, atol=1e-6)
    assert not torch.allclose(a, enc(_padded(x, lengths, 5.0)), atol=1e-3)  # without lengths the pad counts


@pytest.mark.parametrize("kind", ["conv1d", "gru"])
@pytest.mark.parametrize("t", [1, 7, 10])
def test_sequence_padded_from_t_to_2t_gives_the_same_embedding(kind, t):
    torch.manual_seed(1)
    enc = Conv1dEncoder((2, t), [4, 5], 6) if kind == "conv1d" else GRUEncoder((2, t), 5, 6)
    x = torch.randn(3, 2, t)
    alone = enc(x)  # no lengths: every step valid
    padded = torch.cat([x, torch.randn(3, 2, t)], dim=-1)  # garbage after T
    assert torch.allclose(alone, enc(padded, torch.full((3,), t)), atol=1e-6)


def test_token_encoder_mean_of_non_pad_tokens_ignores_padding():
    torch.manual_seed(0)
    enc = TokenEncoder(10, 4, 3)
    ids = torch.tensor([[2, 3, 0, 0], [5, 0, 0, 0]])
    lengths = torch.tensor([2, 1])
    garbage = torch.tensor([[2, 3, 7, 9], [5, 4, 4, 4]])
    assert torch.allclose(enc(ids, lengths), enc(garbage, lengths))
    assert torch.allclose(enc(ids), enc(ids[:, :2]))  # id 0 is pad without lengths too
    e = enc.embed.weight
    assert torch.allclose(enc(ids[:1, :2]), torch.relu(enc.out((e[2] + e[3]) / 2)))
    assert torch.equal(enc(torch.tensor([[42, 0]])), enc(torch.tensor([[1, 0]])))  # out of range: unknown


def test_default_encoder_keeps_cnn_and_mlp_for_existing_shapes():
    assert default_encoder((1, 28, 28)) == "cnn"
    assert default_encoder((384,)) == "mlp"
    assert default_encoder((3, 100)) == "conv1d"
    assert default_encoder((64,), tokens=True) == "tokens"
    # the model's state dict of a FedCMI-like image + audio + vector set, as before the sequence encoders
    torch.manual_seed(0)
    m = MultimodalModel({"image": (1, 28, 28), "audio": (1, 20, 20), "vec": (7,)}, 3, feat_dim=8,
                        cnn_channels=[4], mlp_hidden=[5])
    assert isinstance(m.encoders["image"], CNNEncoder) and isinstance(m.encoders["vec"], MLPEncoder)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items() if k.startswith("encoders.")}
    assert shapes == {
        "encoders.audio.net.0.weight": (4, 1, 3, 3), "encoders.audio.net.1.weight": (4,),
        "encoders.audio.net.1.bias": (4,), "encoders.audio.net.1.running_mean": (4,),
        "encoders.audio.net.1.running_var": (4,), "encoders.audio.net.1.num_batches_tracked": (),
        "encoders.audio.net.6.weight": (8, 36), "encoders.audio.net.6.bias": (8,),
        "encoders.image.net.0.weight": (4, 1, 3, 3), "encoders.image.net.1.weight": (4,),
        "encoders.image.net.1.bias": (4,), "encoders.image.net.1.running_mean": (4,),
        "encoders.image.net.1.running_var": (4,), "encoders.image.net.1.num_batches_tracked": (),
        "encoders.image.net.6.weight": (8, 36), "encoders.image.net.6.bias": (8,),
        "encoders.vec.net.1.weight": (5, 7), "encoders.vec.net.1.bias": (5,),
        "encoders.vec.net.3.weight": (8, 5), "encoders.vec.net.3.bias": (8,)}


def test_encoders_param_overrides_per_modality_and_tokens_from_meta():
    meta = DatasetMeta("s", 3, {"acc": (3, 16), "gyro": (3, 16), "image": (1, 8, 8), "text": (6,)},
                       info={"token_vocab_size": {"text": 12}})
    model = build_model("multimodal", {"feat_dim": 8, "encoders": {"acc": "gru", "gyro": "mlp"}}, meta)
    kinds = {m: type(e).__name__ for m, e in model.encoders.items()}
    assert kinds == {"acc": "GRUEncoder", "gyro": "MLPEncoder", "image": "CNNEncoder", "text": "TokenEncoder"}
    assert model.encoders["text"].embed.weight.shape == (12, 64)
    out = model({"acc": torch.randn(2, 3, 16), "gyro": torch.randn(2, 3, 16), "image": torch.randn(2, 1, 8, 8),
                 "text": torch.tensor([[3, 11, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0]]), LENGTH + "text": torch.tensor([2, 1])})
    assert out["logits"].shape == (2, 3) and torch.isfinite(out["logits"]).all()  # int64 ids are not cast to float
    with pytest.raises(ConfigError, match="model.encoders: image must be one of"):
        build_model("multimodal", {"encoders": {"image": "lstm"}}, meta)
    with pytest.raises(ConfigError, match="'tokens' needs token ids"):
        build_model("multimodal", {"encoders": {"acc": "tokens"}}, meta)
    with pytest.raises(ConfigError, match="'gru' needs"):
        build_model("multimodal", {"encoders": {"image": "gru"}}, meta)
    with pytest.raises(ConfigError, match="model.conv1d_kernel"):
        build_model("multimodal", {"conv1d_kernel": 4}, meta)


def _seq_set(n: int, t: int, seed: int) -> ArrayDataset:
    """Two [3, t] sensor modalities, zero-padded past a random length, label = which channel
    carries a sine (learnable from the valid steps only)."""
    g = np.random.default_rng(seed)
    y = g.integers(0, 3, n)
    lengths = g.integers(t // 3, t + 1, n)
    feats = {}
    for m, phase in (("acc", 0.0), ("gyro", 1.0)):
        x = 0.3 * g.standard_normal((n, 3, t)).astype(np.float32)
        steps = np.arange(t)
        for i in range(n):
            x[i, y[i]] += np.sin(steps / 2.0 + phase).astype(np.float32)
            x[i, :, lengths[i]:] = 0.0
        feats[m] = torch.from_numpy(x)
        feats[LENGTH + m] = torch.from_numpy(lengths.astype(np.int64))
    return ArrayDataset(feats, torch.from_numpy(y.astype(np.int64)))


def test_length_keys_follow_modality_views_and_batches():
    data = _seq_set(10, 12, 0)
    view = data.subset([1, 3, 5]).with_features(["acc"])
    assert sorted(view.features) == ["acc", LENGTH + "acc"]
    feats, _ = view.get()
    assert torch.equal(feats[LENGTH + "acc"], data.features[LENGTH + "acc"][[1, 3, 5]])
    batch, _ = next(view.batches(2, shuffle=False))
    assert batch[LENGTH + "acc"].shape == (2,)
    masked = ArrayDataset({**data.features, PRESENT + "acc": torch.ones(10, dtype=torch.bool)}, data.labels)
    held = held_test_set(masked, ["acc"], np.arange(4))
    assert sorted(held.features) == ["acc", LENGTH + "acc", PRESENT + "acc"]
    assert sorted(masked.with_features(["gyro"]).features) == ["gyro", LENGTH + "gyro"]  # present/ as before


def test_split_client_forward_masks_padded_steps():
    torch.manual_seed(0)
    model = MultimodalModel({"acc": (3, 12), "gyro": (3, 12)}, 3, feat_dim=6, conv1d_channels=[4])
    data = _seq_set(4, 12, 1)
    inputs, _ = data.get()
    noisy = dict(inputs)
    for m in ("acc", "gyro"):
        noisy[m] = _padded(inputs[m], inputs[LENGTH + m].tolist(), 9.0)
    for u in (False, True):
        a, b = client_forward(model, inputs, u), client_forward(model, noisy, u)
        assert all(torch.allclose(a[m], b[m], atol=1e-6) for m in a)
    assert torch.allclose(model(inputs)["logits"], model(noisy)["logits"], atol=1e-6)


@dataclass
class _SeqParams:
    seed: int = 0


def test_fedcmi_runs_on_two_variable_length_sensor_modalities(tmp_path, monkeypatch):
    def factory(p):
        meta = DatasetMeta("seq_test", 3, {"acc": (3, 16), "gyro": (3, 16)}, class_names=["a", "b", "c"])
        return DatasetBundle(train=_seq_set(128, 16, p.seed), test=_seq_set(60, 16, p.seed + 1), meta=meta)

    monkeypatch.setitem(DATASETS._entries, "seq_test", Entry("seq_test", factory, _SeqParams, "test"))
    cfg = config(tmp_path, "seq", base=(
        "data.name=seq_test", "partition.num_clients=4", "case=D", "model.name=multimodal", "model.two_projector=true",
        "model.feat_dim=16", "model.conv1d_channels=[8]", "model.encoders={gyro = \"gru\"}", "model.gru_hidden=8",
        "algorithm.name=fedcmi", "train.local_epochs=3", "train.batch_size=16", "train.optimizer=\"sgd\"", "train.lr=0.05",
        "threads=1"))
    exp = run_config(cfg)
    rows = [json.loads(line) for line in (exp.run_dir / "metrics.jsonl").read_text().splitlines()]
    acc = [r["accuracy"] for r in rows if "accuracy" in r]
    assert acc and np.isfinite(acc[-1]) and acc[-1] > 0.5  # chance is 1/3
    assert type(exp.server.model.encoders["gyro"]).__name__ == "GRUEncoder"
