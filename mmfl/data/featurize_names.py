"""The frozen encoders' names, sizes and input digests (:mod:`mmfl.data.featurize` encodes texts,
:mod:`mmfl.data.featurize_image` images): parsing ``"hash:<d>"`` / ``"pixels:<s>"``, the feature
size an encoder gives, and the content hashes that key the preprocessing cache."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from mmfl.errors import ConfigError

MINILM_DIM = 384
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
