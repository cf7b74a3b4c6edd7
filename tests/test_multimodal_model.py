"""The multimodal model: shapes per fusion, client models (holds), missing-modality fill,
gradients, state-dict key helpers, config errors."""

import pytest
import torch
from torch import nn

from mmfl.data.base import PRESENT, DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import MODELS
from mmfl.models.flops import count_flops
from mmfl.models.multimodal import MultimodalModel, branch_of, module_of

AV = DatasetMeta("av", 6, {"image": (1, 28, 28), "audio": (1, 40, 32)})
IF = DatasetMeta("if", 4, {"image": (1, 16, 15), "features": (123,)})
B = 3
SMALL = {"feat_dim": 8, "cnn_channels": [4, 4], "mlp_hidden": [16]}


def build(meta, holds=None, **values):
    params = MODELS.params("multimodal", {**SMALL, **values})
    return MODELS.get("multimodal").factory(params, meta, holds)


def batch(meta, b=B):
    g = torch.Generator().manual_seed(0)
    return {m: torch.randn(b, *s, generator=g) for m, s in meta.modalities.items()}


@pytest.mark.parametrize("meta", [AV, IF], ids=["av", "image+features"])
@pytest.mark.parametrize("fusion,out_mul", [("concat", 2), ("sum", 1), ("film", 1), ("gated", 1)])
def test_output_shapes(meta, fusion, out_mul):
    model = build(meta, fusion=fusion, two_projector=True)
    out = model(batch(meta))
    c, d = meta.num_classes, 8
    assert out["logits"].shape == (B, c)
    assert out["rep"].shape == (B, out_mul * d) and out["features"] is out["rep"]
    assert model.fusion_out_dim == out_mul * d
    for key in ("mod_feats", "mod_reps", "ip_reps"):
        assert {m: t.shape for m, t in out[key].items()} == {m: (B, d) for m in meta.modalities}
    for key in ("mod_logits", "ip_logits"):
        assert {m: t.shape for m, t in out[key].items()} == {m: (B, c) for m in meta.modalities}
    assert all(p.dtype == torch.bool and p.all() for p in out["present"].values())
    tops = {n.split(".")[0] for n, _ in model.named_parameters()}
    assert tops == {"encoders", "proj", "infil", "heads", "classifier"} | ({"fusion"} if fusion in ("film", "gated") else set())
    kinds = {m: type(e).__name__ for m, e in model.encoders.items()}
    assert kinds == {m: "CNNEncoder" if len(s) == 3 else "MLPEncoder" for m, s in meta.modalities.items()}


def test_defaults_and_projectors():
    model = build(AV)
    assert model.infil is None and isinstance(model.proj["audio"], nn.Sequential)
    assert isinstance(build(AV, projector="none").proj["audio"], nn.Identity)
    assert isinstance(build(AV, projector="linear").proj["image"], nn.Linear)
    assert isinstance(build(AV, encoders={"image": "mlp"}).encoders["image"].net[1], nn.Linear)
    out = model(batch(AV))
    assert out["ip_reps"] == {} and out["ip_logits"] == {}


def test_holds_subset_of_full_and_equal_tensors():
    torch.manual_seed(7)
    full = build(AV, two_projector=True)
    torch.manual_seed(7)
    part = build(AV, holds=["audio"], two_projector=True)
    fsd, psd = full.state_dict(), part.state_dict()
    image_keys = {k for k in fsd if branch_of(k) == "image"}
    assert image_keys and all(k.split(".")[0] in ("encoders", "proj", "infil", "heads") for k in image_keys)
    assert set(psd) == set(fsd) - image_keys
    for k, v in psd.items():
        assert torch.equal(v, fsd[k]), k
    assert part.holds == ["audio"] and part.modalities == ["audio", "image"]
    # the audio-only model runs on a batch that lacks the image entirely
    out = part({"audio": batch(AV)["audio"]})
    assert out["logits"].shape == (B, 6) and set(out["mod_logits"]) == {"audio"}


def test_zero_fill_matches_manual_concat():
    torch.manual_seed(0)
    model = build(AV).eval()
    x = batch(AV)
    x[PRESENT + "image"] = torch.tensor([True, False, True])
    out = model(x)
    assert out["present"]["image"].tolist() == [True, False, True]
    assert out["present"]["audio"].all()
    z_a, z_i = out["mod_reps"]["audio"], out["mod_reps"]["image"].clone()
    z_i[1] = 0
    manual = model.classifier(torch.cat([z_a, z_i], dim=1))  # slots in sorted order: audio, image
    assert torch.allclose(out["logits"], manual, atol=1e-6)
    assert torch.allclose(out["rep"][1, 8:], torch.zeros(8))
    assert not torch.allclose(out["rep"][0, 8:], torch.zeros(8))


def test_infiltration_fill_audio_only():
    torch.manual_seed(0)
    model = build(AV, two_projector=True).eval()
    out = model({"audio": batch(AV)["audio"]})
    manual = model.classifier(torch.cat([out["mod_reps"]["audio"], out["ip_reps"]["audio"]], dim=1))
    assert torch.allclose(out["logits"], manual, atol=1e-6)
    # same through a per-sample mask; a sample with no modality at all gets zeros
    x = batch(AV)
    x[PRESENT + "image"] = torch.tensor([False, True, False])
    x[PRESENT + "audio"] = torch.tensor([True, True, False])
    out = model(x)
    r, d = out["rep"], 8
    assert torch.allclose(r[0, d:], out["ip_reps"]["audio"][0])
    assert torch.allclose(r[1], torch.cat([out["mod_reps"]["audio"][1], out["mod_reps"]["image"][1]]))
    assert torch.equal(r[2], torch.zeros(2 * d))


def test_gradients_reach_encoders():
    for key in ("mod_logits", "logits"):
        model = build(IF, fusion="gated")
        out = model(batch(IF))
        y = torch.arange(B) % 4
        if key == "logits":
            loss = nn.functional.cross_entropy(out["logits"], y)
        else:
            loss = sum(nn.functional.cross_entropy(v, y) for v in out["mod_logits"].values())
        loss.backward()
        for m, enc in model.encoders.items():
            assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters()), (key, m)


def test_module_of_branch_of():
    assert module_of("encoders.image.net.0.weight") == "encoders.image"
    assert module_of("heads.audio.weight") == "heads.audio"
    assert module_of("fusion.lin.weight") == "fusion"
    assert module_of("classifier.bias") == "classifier"
    assert branch_of("infil.audio.0.bias") == "audio" and branch_of("proj.image.weight") == "image"
    assert branch_of("fusion.fc.weight") is None and branch_of("classifier.weight") is None
    model = build(AV, two_projector=True, fusion="film")
    assert "encoders.image.net.0.weight" in model.state_dict()
    mods = {module_of(k) for k in model.state_dict()}
    assert mods == {f"{p}.{m}" for p in ("encoders", "proj", "infil", "heads") for m in ("audio", "image")} \
        | {"fusion", "classifier"}


@pytest.mark.parametrize("values,meta,holds,match", [
    ({"feat_dim": 0}, AV, None, "model.feat_dim"),
    ({"projector": "deep"}, AV, None, "model.projector"),
    ({"fusion": "attention"}, AV, None, "model.fusion"),
    ({"dropout": 1.0}, AV, None, "model.dropout"),
    ({"cnn_channels": []}, AV, None, "model.cnn_channels"),
    ({"cnn_channels": [2, 2, 2, 2, 2]}, IF, None, "model.cnn_channels"),
    ({"mlp_hidden": [0]}, AV, None, "model.mlp_hidden"),
    ({"encoders": {"image": "rnn"}}, AV, None, "model.encoders"),
    ({"encoders": {"video": "cnn"}}, AV, None, "model.encoders"),
    ({"encoders": {"features": "cnn"}}, IF, None, "model.encoders"),
    ({"fusion": "film"}, DatasetMeta("one", 3, {"x": (5,)}), None, "model.fusion"),
    ({}, AV, ["video"], "video"),
    ({"two_projector": "yes"}, AV, None, "model.two_projector"),
])
def test_bad_params(values, meta, holds, match):
    with pytest.raises(ConfigError, match=match):
        build(meta, holds, **values)


def test_direct_class_single_modality_and_flops():
    model = MultimodalModel({"x": (5,)}, 3, feat_dim=4, fusion="sum")
    out = model({"x": torch.randn(2, 5)})
    assert out["logits"].shape == (2, 3) and out["rep"].shape == (2, 4)
    rgb = DatasetMeta("img", 5, {"image": (3, 64, 64)})
    assert build(rgb)(batch(rgb, 2))["logits"].shape == (2, 5)
    assert count_flops(model, {"x": torch.randn(1, 5)}) > 0
