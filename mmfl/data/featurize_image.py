"""Frozen image encoders (:func:`image_features`: ``"mobilenet_v2"``, ``"pixels:<s>"``; the names
and digests are :mod:`mmfl.data.featurize_names`'s) and the ``fashion_mnist_features``
data set built on them. Images are uint8 ``[N, H, W, C]`` with C = 1 (grey, repeated to RGB),
3 (RGB) or 4 (RGBA, composited on white).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.cache import announce, progress
from mmfl.data.featurize_names import (FEATURE_VERSION, MOBILENET_DIM, array_digest, check_image_size, image_feature_dim,
                                       parse_image_encoder)
from mmfl.errors import ConfigError, DataError


def _check_images(images) -> np.ndarray:
    """uint8 ``[N, H, W, C]`` (C in 1, 3, 4) as a numpy array; ``[N, H, W]`` is grey."""
    if isinstance(images, Tensor):
        images = images.detach().cpu().numpy()
    arr = np.asarray(images)
    if arr.dtype != np.uint8:
        raise TypeError(f"image_features: expected uint8 images, got {arr.dtype}")
    if arr.ndim == 3:
        arr = arr[..., None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"image_features: expected images [N, H, W, C] with C in 1, 3, 4, got {arr.shape}")
    return arr


def composite_rgb(images: np.ndarray | Tensor) -> Tensor:
    """uint8 ``[N, H, W, C]`` -> float32 RGB ``[N, 3, H, W]`` in [0, 1]: RGBA is composited on
    white (``rgb * a + 1 - a``), grey is repeated to three channels."""
    x = torch.from_numpy(np.array(_check_images(images)))  # a copy: the caller's array may be read-only
    x = x.permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    c = x.shape[1]
    if c == 4:
        rgb, a = x[:, :3], x[:, 3:4]
        x = rgb * a + (1.0 - a)
    elif c == 1:
        x = x.expand(-1, 3, -1, -1)
    return x.contiguous()


def _resize(x: Tensor, size: int) -> Tensor:
    if x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)


@functools.lru_cache(maxsize=1)
def _mobilenet():
    from mmfl.data.mobilenet import mobilenet_v2

    # channels-last runs the depthwise convolutions ~1.5x faster on CPU (same results)
    model = mobilenet_v2(pretrained=True).eval().to(memory_format=torch.channels_last)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _pixels_image(arr: np.ndarray, s: int, batch_size: int = 1024) -> Tensor:
    """Grey (ITU-R 601 luma) resized to s x s, flattened: float32 ``[N, s*s]`` in [0, 1]."""
    w = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    out = []
    for i in range(0, len(arr), batch_size):
        x = composite_rgb(arr[i : i + batch_size])
        grey = (x * w).sum(1, keepdim=True)
        out.append(_resize(grey, s).clamp_(0.0, 1.0).flatten(1))
    return torch.cat(out)


def _mobilenet_image(arr: np.ndarray, size: int, batch_size: int = 64) -> Tensor:
    """ImageNet MobileNetV2 pooled features: float32 ``[N, 1280]``."""
    from mmfl.data.mobilenet import IMAGENET_MEAN, IMAGENET_STD

    model = _mobilenet()
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    out = torch.empty(len(arr), MOBILENET_DIM)
    starts = range(0, len(arr), batch_size)
    with torch.inference_mode():
        for i in progress(starts, len(starts), "batch", "MobileNetV2"):
            x = (_resize(composite_rgb(arr[i : i + batch_size]), size) - mean) / std
            out[i : i + len(x)] = model.features_pooled(x.contiguous(memory_format=torch.channels_last))
    return out


def _encode_image(kind: str, arg: int, arr: np.ndarray, size: int) -> Tensor:
    if kind == "pixels":
        return _pixels_image(arr, arg)
    return _mobilenet_image(arr, size)


def image_features(images, encoder: str = "mobilenet_v2", *, size: int = 224, cache: bool = True,
                   cache_root: str | Path | None = None) -> Tensor:
    """Frozen image features: float32 ``[N, d]`` (1280 for ``"mobilenet_v2"``, s*s for ``"pixels:<s>"``).

    ``images``: uint8 ``[N, H, W, C]`` (numpy or torch; C = 1, 3 or 4; ``[N, H, W]`` is grey).
    ``size``: the side MobileNetV2's input is resized to (224 = ImageNet's; 96 or 128 are
    4-5x / 3x faster). Cached by (encoder, size, content of the images).
    """
    kind, arg = parse_image_encoder(encoder, "encoder")
    if kind == "mobilenet_v2":
        check_image_size(size, "size")
    arr = _check_images(images)
    dim = arg * arg if kind == "pixels" else arg
    if not len(arr):
        return torch.zeros(0, dim)

    def compute():
        if kind == "mobilenet_v2" and cache:  # the slow one: say what runs and that it runs once
            announce(f"embedding {len(arr):,} images with MobileNetV2 at {size}x{size}", "image-features",
                     cache_root)
        return {"x": _encode_image(kind, arg, arr, size).to(torch.float32).contiguous()}

    if not cache:
        return compute()["x"]
    from mmfl.data.cache import cached

    settings = {"encoder": f"{kind}:{arg}", "inputs": array_digest(arr), "shape": list(arr.shape),
                "composite": "RGBA on white, grey repeated", "resize": "bilinear antialias"}
    if kind == "mobilenet_v2":
        from mmfl.data.mobilenet import WEIGHTS_FILE
        settings.update(size=size, weights=WEIGHTS_FILE, normalize="imagenet", pool="global mean")
    else:
        settings.update(grey="itu601")
    return cached("image-features", [], settings, compute, version=FEATURE_VERSION, root=cache_root)["x"]


def float_images_to_uint8(x: Tensor) -> np.ndarray:
    """float ``[N, C, H, W]`` in [0, 1] -> uint8 ``[N, H, W, C]`` (what :func:`image_features` takes)."""
    return (x.clamp(0, 1) * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


# ----------------------------------------------------------------------------- Fashion-MNIST features

@dataclass
class FashionMnistFeaturesParams:
    root: str = field(default="/usr/share/datasets/fashion-mnist",
                      metadata={"help": "directory with the four Fashion-MNIST IDX files (.gz or plain)"})
    train_limit: int = field(default=2000, metadata={"help": "seeded random subset of this many train "
                                                             "images (0 = all 60,000: slow to encode)"})
    test_limit: int = field(default=1000, metadata={"help": "likewise for the 10,000 test images (0 = all)"})
    image_encoder: str = field(default="mobilenet_v2", metadata={
        "help": "frozen image encoder: mobilenet_v2 (1280-d, ImageNet) or pixels:<s> (s*s grey pixels)"})
    image_size: int = field(default=96, metadata={"help": "side the 28x28 images are resized to for "
                                                          "mobilenet_v2 (>= 32; 224 = ImageNet's)"})
    seed: int = field(default=0, metadata={"help": "seed of the train/test subsets"})

    def __post_init__(self):
        for key in ("train_limit", "test_limit"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}: must be >= 0 (0 = all), got {getattr(self, key)}")
        parse_image_encoder(self.image_encoder, "data.image_encoder")
        check_image_size(self.image_size, "data.image_size")


@DATASETS.register("fashion_mnist_features", FashionMnistFeaturesParams,
                   help="Fashion-MNIST through a frozen image encoder: image = [1280] MobileNetV2 features "
                        "(2,000 train / 1,000 test by default)")
def fashion_mnist_features(p: FashionMnistFeaturesParams) -> DatasetBundle:
    """Fashion-MNIST as frozen-encoder features: ``image`` float32 ``[N, d]``, 10 classes."""
    from mmfl.data.idx import FASHION_CLASSES, load_idx_dir

    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: Fashion-MNIST directory not found "
                        "(apt-get install dataset-fashion-mnist, or set data.root)")
    raw = load_idx_dir(root, "fashion_mnist_features", FASHION_CLASSES, p.train_limit, p.test_limit, p.seed)
    splits = {}
    for name, ds in (("train", raw.train), ("test", raw.test)):
        ds = ds.materialize()
        feats = image_features(float_images_to_uint8(ds.features["image"]), p.image_encoder, size=p.image_size)
        splits[name] = ArrayDataset({"image": feats}, ds.labels)
    dim = image_feature_dim(p.image_encoder)
    meta = DatasetMeta(name="fashion_mnist_features", num_classes=raw.meta.num_classes,
                       modalities={"image": (dim,)}, class_names=raw.meta.class_names,
                       info={**raw.meta.info, "encoder": {"image": p.image_encoder, "image_size": p.image_size},
                             "raw_shape": list(raw.meta.modalities["image"])})
    return DatasetBundle(train=splits["train"], test=splits["test"], meta=meta)
