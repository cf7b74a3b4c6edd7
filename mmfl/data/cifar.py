"""CIFAR-10 and CIFAR-100 in their released "python version" pickle format.

CIFAR cannot be downloaded here, so ``root`` must point at a copy the user
has: ``cifar-10-batches-py`` (``data_batch_1`` .. ``data_batch_5``,
``test_batch``, ``batches.meta``) or ``cifar-100-python`` (``train``,
``test``, ``meta``), or at a directory containing that folder. Each batch is a
pickled dict with byte-string keys: ``b"data"`` uint8 ``[N, 3072]`` (1024 red,
then green, then blue values, row-major 32x32) and ``b"labels"`` (CIFAR-10) or
``b"fine_labels"``/``b"coarse_labels"`` (CIFAR-100).

Modality ``"image"``: float32 ``[N, 3, 32, 32]`` in [0, 1]; labels int64.
Pickles are read with an unpickler that only admits lists, dicts, bytes and
numpy arrays, so a tampered file cannot run code.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.errors import ConfigError, DataError

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
CIFAR10_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]

# globals an array pickle may reference (numpy 1.x pickles name numpy.core)
_SAFE_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("numpy.core"):
            module = "numpy._core" + module[len("numpy.core"):]
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def load_pickle(path: Path) -> dict:
    """A CIFAR batch/meta pickle -> dict (keys as stored, usually bytes). DataError if unreadable."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        obj = _SafeUnpickler(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    except Exception as e:  # noqa: BLE001 - truncated/corrupt pickles raise many types
        raise DataError(f"{path}: corrupt or not a CIFAR pickle ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _key(d: dict, key: str, path: Path) -> Any:
    for k in (key.encode(), key):
        if k in d:
            return d[k]
    raise DataError(f"{path}: missing key {key!r}")


def _names(d: dict, key: str, path: Path) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in _key(d, key, path)]


def read_batch(path: Path, label_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch file -> (images float32 ``[N, 3, 32, 32]`` in [0, 1], labels int64 ``[N]``)."""
    d = load_pickle(path)
    data = np.asarray(_key(d, "data", path))
    labels = np.asarray(_key(d, label_key, path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: 'data' must be uint8 [N, 3072], got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: {label_key!r} must be {data.shape[0]} integers, got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise DataError(f"{path}: negative label {int(labels.min())}")
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def _resolve(root: str, folder: str, probe: str) -> Path:
    d = Path(root).expanduser()
    if not (d / probe).exists() and (d / folder).is_dir():
        d = d / folder
    if not d.is_dir():
        raise DataError(f"{d}: CIFAR directory not found (expected the released {folder} folder)")
    return d


def _bundle(name: str, d: Path, train: list[tuple], test: tuple, class_names: list[str], info: dict):
    xs, ys = zip(*train)
    y_tr, y_te = torch.cat(ys), test[1]
    top = int(max(y_tr.max(), y_te.max()))
    if top >= len(class_names):
        raise DataError(f"{d}: label {top} but only {len(class_names)} class names in the meta file")
    meta = DatasetMeta(name=name, num_classes=len(class_names), modalities={"image": (3, 32, 32)},
                       class_names=class_names, info={"source": str(d), **info})
    return DatasetBundle(train=ArrayDataset({"image": torch.cat(xs)}, y_tr),
                         test=ArrayDataset({"image": test[0]}, y_te), meta=meta)


def _check_root(root: str, what: str) -> None:
    if not root:
        raise ConfigError(f"data.root: required for {what} (the {what} folder of the "
                          "python-pickle release; it cannot be downloaded here)")


@dataclass
class Cifar10Params:
    root: str = field(default="", metadata={"help": f"(required) the {CIFAR10_DIR} directory, or its parent"})

    def __post_init__(self):
        _check_root(self.root, CIFAR10_DIR)


@DATASETS.register("cifar10", Cifar10Params, help="CIFAR-10 from its python-pickle release at data.root")
def cifar10(p: Cifar10Params) -> DatasetBundle:
    """CIFAR-10: 50,000 + 10,000 images ``[3, 32, 32]``, 10 classes."""
    d = _resolve(p.root, CIFAR10_DIR, "batches.meta")
    names = _names(load_pickle(d / "batches.meta"), "label_names", d / "batches.meta")
    train = [read_batch(d / f, "labels") for f in CIFAR10_TRAIN]
    return _bundle("cifar10", d, train, read_batch(d / "test_batch", "labels"), names, {})


@dataclass
class Cifar100Params:
    root: str = field(default="", metadata={"help": f"(required) the {CIFAR100_DIR} directory, or its parent"})
    label_mode: Literal["fine", "coarse"] = field(default="fine", metadata={
        "help": "fine (100 classes) or coarse (20 superclasses)"})

    def __post_init__(self):
        _check_root(self.root, CIFAR100_DIR)
        if self.label_mode not in ("fine", "coarse"):
            raise ConfigError(f"data.label_mode: must be 'fine' or 'coarse', got {self.label_mode!r}")


@DATASETS.register("cifar100", Cifar100Params, help="CIFAR-100 from its python-pickle release at data.root")
def cifar100(p: Cifar100Params) -> DatasetBundle:
    """CIFAR-100: 50,000 + 10,000 images ``[3, 32, 32]``, 100 fine or 20 coarse classes."""
    d = _resolve(p.root, CIFAR100_DIR, "meta")
    names = _names(load_pickle(d / "meta"), f"{p.label_mode}_label_names", d / "meta")
    key = f"{p.label_mode}_labels"
    return _bundle("cifar100", d, [read_batch(d / "train", key)], read_batch(d / "test", key), names,
                   {"label_mode": p.label_mode})
