"""IDX files (the MNIST format) and the data sets stored in it.

An IDX file is a 4-byte magic number ``00 00 <dtype> <ndim>``, then ``ndim``
big-endian uint32 dimensions, then the row-major data in big-endian order.
Files may be gzip-compressed (``.gz``; detected by content, not by name).

Registered data sets (modality ``"image"``: float32 ``[N, 1, H, W]`` in
[0, 1]; labels int64 ``[N]``):

* ``fashion_mnist``: Fashion-MNIST from Debian's ``dataset-fashion-mnist``
  (60,000 train + 10,000 test, 28x28, 10 classes).
* ``mnist_idx``: any directory with the four standard MNIST-format files.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.errors import ConfigError, DataError

# IDX dtype code -> big-endian numpy dtype
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]

# (split, kind) -> standard file name without ".gz"
IDX_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (plain or gzip) into an array of its stored shape.

    The result has the native-endian version of the stored dtype. Raises
    :class:`DataError` ``"<path>: ..."`` if the file is missing, not IDX, or
    its length does not match the header.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if len(raw) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    if raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (magic bytes {raw[:4].hex()})")
    code, ndim = raw[2], raw[3]
    if code not in IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX dtype code 0x{code:02x}")
    if ndim == 0:
        raise DataError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "has trailing bytes"
        raise DataError(f"{path}: {what}: {len(raw)} bytes, header {dims} implies {expected}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def find_idx_file(root: Path, name: str) -> Path:
    """``root/name`` or ``root/name.gz``, whichever exists (DataError if neither)."""
    for cand in (root / name, root / f"{name}.gz"):
        if cand.is_file():
            return cand
    raise DataError(f"{root}: missing {name} (or {name}.gz)")


def images_to_tensor(arr: np.ndarray, path: Path) -> torch.Tensor:
    """``[N, H, W]`` (or ``[N, C, H, W]``) IDX images -> float32 ``[N, C, H, W]``.

    uint8 images are divided by 255; other dtypes are kept as stored.
    """
    if arr.ndim == 3:
        arr = arr[:, None]
    elif arr.ndim != 4:
        raise DataError(f"{path}: expected images [N, H, W], got shape {arr.shape}")
    t = torch.from_numpy(np.ascontiguousarray(arr)).to(torch.float32)
    return t.div_(255.0) if arr.dtype == np.uint8 else t


def _labels_to_tensor(arr: np.ndarray, path: Path) -> torch.Tensor:
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"{path}: expected integer labels [N], got {arr.dtype} {arr.shape}")
    if arr.size and arr.min() < 0:
        raise DataError(f"{path}: negative label {int(arr.min())}")
    return torch.from_numpy(arr.astype(np.int64))


def _limit(ds: ArrayDataset, limit: int, rng: np.random.Generator) -> ArrayDataset:
    """A seeded random subset of ``limit`` rows (all rows if 0 or >= len)."""
    if limit <= 0 or limit >= len(ds):
        return ds
    idx = np.sort(rng.choice(len(ds), size=limit, replace=False))
    return ds.subset(idx).materialize()


def decode_split(ipath: Path, lpath: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (float32 ``[N, C, H, W]``) and labels of one split, decoded once per file
    content (:mod:`mmfl.data.cache`; decoding the gzip'd 60,000 Fashion-MNIST images
    takes seconds, loading the cached tensors milliseconds)."""
    from mmfl.data.cache import cached

    def decode():
        return {"x": images_to_tensor(read_idx(ipath), ipath), "y": _labels_to_tensor(read_idx(lpath), lpath)}

    out = cached("idx", [ipath, lpath], {"images": "float32 /255 if uint8", "labels": "int64"}, decode)
    return out["x"], out["y"]


def load_idx_dir(root: str | Path, name: str, class_names: list[str] | None = None,
                 train_limit: int = 0, test_limit: int = 0, seed: int = 0) -> DatasetBundle:
    """Load the four standard MNIST-format files under ``root`` into a bundle."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: directory not found")
    splits = {}
    for split in ("train", "test"):
        ipath = find_idx_file(root, IDX_FILES[(split, "images")])
        lpath = find_idx_file(root, IDX_FILES[(split, "labels")])
        x, y = decode_split(ipath, lpath)
        if x.shape[0] != y.shape[0]:
            raise DataError(f"{ipath}: {x.shape[0]} images but {lpath.name} has {y.shape[0]} labels")
        splits[split] = ArrayDataset({"image": x}, y)
    tr, te = splits["train"], splits["test"]
    if tr.features["image"].shape[1:] != te.features["image"].shape[1:]:
        raise DataError(f"{root}: train images {tuple(tr.features['image'].shape[1:])} "
                        f"and test images {tuple(te.features['image'].shape[1:])} differ in shape")
    rng = np.random.default_rng(seed)
    tr = _limit(tr, train_limit, rng)
    te = _limit(te, test_limit, rng)
    top = max(int(tr.labels.max()) if len(tr) else -1, int(te.labels.max()) if len(te) else -1)
    num_classes = max(top + 1, len(class_names or []))
    names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
    meta = DatasetMeta(name=name, num_classes=num_classes,
                       modalities={"image": tuple(tr.features["image"].shape[1:])},
                       class_names=names, info={"source": str(root)})
    return DatasetBundle(train=tr, test=te, meta=meta)


def _check_limits(p) -> None:
    for key in ("train_limit", "test_limit"):
        if getattr(p, key) < 0:
            raise ConfigError(f"data.{key}: must be >= 0 (0 = all), got {getattr(p, key)}")


@dataclass
class FashionMnistParams:
    root: str = field(default="/usr/share/datasets/fashion-mnist",
                      metadata={"help": "directory with the four Fashion-MNIST IDX files (.gz or plain)"})
    train_limit: int = field(default=0, metadata={"help": "use a seeded random subset of this many "
                                                          "train samples (0 = all 60,000)"})
    test_limit: int = field(default=0, metadata={"help": "likewise for the 10,000 test samples (0 = all)"})
    seed: int = field(default=0, metadata={"help": "seed of the train/test subsets"})

    def __post_init__(self):
        _check_limits(self)


@DATASETS.register("fashion_mnist", FashionMnistParams,
                   help="Fashion-MNIST, 10 clothing classes, image [1,28,28] (Debian dataset-fashion-mnist)")
def fashion_mnist(p: FashionMnistParams) -> DatasetBundle:
    """Fashion-MNIST: image ``[N, 1, 28, 28]`` in [0, 1], 10 classes."""
    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: Fashion-MNIST directory not found "
                        "(apt-get install dataset-fashion-mnist, or set data.root)")
    return load_idx_dir(root, "fashion_mnist", FASHION_CLASSES, p.train_limit, p.test_limit, p.seed)


@dataclass
class MnistIdxParams:
    root: str = field(default="", metadata={"help": "(required) directory with train-images-idx3-ubyte[.gz], "
                                                    "train-labels-idx1-ubyte[.gz], t10k-... files"})
    train_limit: int = field(default=0, metadata={"help": "use a seeded random subset of this many "
                                                          "train samples (0 = all)"})
    test_limit: int = field(default=0, metadata={"help": "likewise for the test samples (0 = all)"})
    seed: int = field(default=0, metadata={"help": "seed of the train/test subsets"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for mnist_idx (a directory of MNIST-format IDX files)")
        _check_limits(self)


@DATASETS.register("mnist_idx", MnistIdxParams,
                   help="any data set in the MNIST IDX format (four standard files in data.root)")
def mnist_idx(p: MnistIdxParams) -> DatasetBundle:
    """An MNIST-format directory: image ``[N, 1, H, W]``, classes 0..max label."""
    return load_idx_dir(p.root, "mnist_idx", None, p.train_limit, p.test_limit, p.seed)
