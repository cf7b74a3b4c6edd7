"""CREMA-D (audio-visual emotion), read from the user's copy in its released layout.

Registered as ``crema_d``. CREMA-D cannot be downloaded here, so ``root`` (required)
points at a folder holding::

    AudioWAV/<ActorID>_<Sentence>_<Emotion>_<Level>.wav   e.g. 1001_DFA_ANG_XX.wav (16 kHz mono)
    Image-01-FPS/<clip>/*.jpg                              frames extracted from VideoFlash/<clip>.flv
    train.csv, test.csv                                    optional: lines "clip,EMOTION" (OGM-GE format)

the frames folder being the one OGM-GE / PMR's preprocessing writes (one frame
per second; ``frames_dir`` names another). Each clip gives one sample, paired per
instance (the audio and the face of the same utterance):

* ``image``: float32 ``[channels, image_size, image_size]`` in [0, 1], the middle
  frame (or the mean of ``num_frames`` evenly spaced frames), via Pillow;
* ``audio``: float32 ``[1, n_mels, frames]``, the log-mel spectrogram
  (:mod:`mmfl.data.audio`) of a centred ``seconds`` window, standardized with the
  train split's scalar mean/std.

Labels are the six emotions in alphabetical order: ANG DIS FEA HAP NEU SAD.
Without ``train.csv`` / ``test.csv`` the split is by actor (``test_fraction`` of the
91 actors, seeded). ``client_ids`` numbers the train split's actors, so the
``natural`` partitioner gives one client per speaker.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.audio import (check_audio_params, fit_window, hop_for, log_mel, read_wav_mono, standardize_scalar,
                             stat_fingerprint)
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.split import check_fraction
from mmfl.errors import ConfigError, DataError

EMOTIONS = ["ANG", "DIS", "FEA", "HAP", "NEU", "SAD"]  # label = position (alphabetical)
CLIP_NAME = re.compile(r"^(\d+)_([A-Za-z]+)_([A-Z]{3})_([A-Za-z]+)$")  # actor, sentence, emotion, level
FRAME_EXTS = (".jpg", ".jpeg", ".png")
CHUNK = 256  # clips per STFT batch


@dataclass
class CremaDParams:
    root: str = field(default="", metadata={
        "help": "(required) CREMA-D folder holding AudioWAV/ and the extracted frames folder"})
    frames_dir: str = field(default="Image-01-FPS", metadata={
        "help": "folder in root with one sub-folder of .jpg frames per clip (OGM-GE preprocessing)"})
    num_frames: int = field(default=1, metadata={
        "help": "frames per clip: 1 = the middle frame, k = the mean of k evenly spaced frames"})
    channels: int = field(default=3, metadata={"help": "image channels: 1 (grayscale) or 3 (RGB)"})
    image_size: int = field(default=64, metadata={"help": "frames are resized to this square size"})
    seconds: float = field(default=3.0, metadata={"help": "audio window in seconds (centred crop or zero pad)"})
    sample_rate: int = field(default=16000, metadata={"help": "audio is resampled to this rate if it differs"})
    n_mels: int = field(default=64, metadata={"help": "mel bands of the audio log-mel spectrogram"})
    frames: int = field(default=64, metadata={"help": "time frames over the audio window"})
    n_fft: int = field(default=512, metadata={"help": "STFT size (a power of two)"})
    test_fraction: float = field(default=0.1, metadata={
        "help": "share of actors in the test split when root has no train.csv/test.csv"})
    seed: int = field(default=0, metadata={"help": "seed of the actor split"})
    skip_incomplete: bool = field(default=True, metadata={
        "help": "skip clips without frames (counted in meta.info['skipped']); false = a DataError"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for crema_d (the folder holding AudioWAV/ and "
                              f"{self.frames_dir or 'Image-01-FPS'}/)")
        if self.channels not in (1, 3):
            raise ConfigError(f"data.channels: must be 1 or 3, got {self.channels}")
        for key in ("num_frames", "image_size", "sample_rate"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}: must be >= 1, got {getattr(self, key)}")
        if not self.seconds > 0:
            raise ConfigError(f"data.seconds: must be > 0, got {self.seconds}")
        if not self.frames_dir:
            raise ConfigError("data.frames_dir: must name the frames folder in root")
        check_audio_params(self.n_mels, self.frames, self.n_fft, self.window)
        check_fraction(self.test_fraction)

    @property
    def window(self) -> int:
        return int(round(self.seconds * self.sample_rate))


def parse_clip(name: str) -> tuple[str, str] | None:
    """``"1001_DFA_ANG_XX"`` -> ``("1001", "ANG")``; None for a name not in CREMA-D's pattern."""
    m = CLIP_NAME.match(name)
    return (m.group(1), m.group(3)) if m else None


def read_split_csv(path: Path, wav_dir: Path) -> list[tuple[str, int]]:
    """OGM-GE split file (``clip,EMOTION`` per line; a header line is skipped) -> [(clip, label)]."""
    out = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    for i, row in enumerate(rows, 1):
        row = [c.strip() for c in row]
        if not row or not row[0]:
            continue
        if len(row) < 2 or row[1].upper() not in EMOTIONS:
            if i == 1 and len(out) == 0:
                continue  # header
            raise DataError(f"{path}: line {i}: expected 'clip,EMOTION' with EMOTION one of "
                            f"{' '.join(EMOTIONS)}, got {','.join(row)!r}")
        clip = row[0][:-4] if row[0].lower().endswith(".wav") else row[0]
        emo = row[1].upper()
        parsed = parse_clip(clip)
        if parsed is None:
            raise DataError(f"{path}: line {i}: {clip!r} is not a CREMA-D clip name "
                            "(<ActorID>_<Sentence>_<Emotion>_<Level>)")
        if parsed[1] != emo:
            raise DataError(f"{path}: line {i}: label {emo} contradicts the clip name {clip}")
        if not (wav_dir / f"{clip}.wav").is_file():
            raise DataError(f"{wav_dir / (clip + '.wav')}: file not found (listed in {path.name} line {i})")
        out.append((clip, EMOTIONS.index(emo)))
    return out


def frame_files(folder: Path, num_frames: int) -> list[Path]:
    """The frames a clip uses: the middle one, or ``num_frames`` evenly spaced (sorted by name)."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in FRAME_EXTS) if folder.is_dir() else []
    if not files:
        return []
    if num_frames == 1:
        return [files[len(files) // 2]]
    pos = np.linspace(0, len(files) - 1, num_frames).round().astype(int)
    return [files[i] for i in pos]


def read_frames(paths: list[Path], channels: int, size: int) -> np.ndarray:
    """Mean of the frames, each converted (L or RGB) and resized (bilinear): float32 ``[C, size, size]``."""
    from PIL import Image, UnidentifiedImageError

    acc = np.zeros((size, size, channels), dtype=np.float32)
    for path in paths:
        try:
            with Image.open(path) as img:
                img = img.convert("L" if channels == 1 else "RGB").resize((size, size), Image.BILINEAR)
                arr = np.asarray(img, dtype=np.float32) / 255.0
        except (OSError, UnidentifiedImageError, ValueError) as e:
            raise DataError(f"{path}: cannot read the image ({e})") from None
        acc += arr.reshape(size, size, channels)
    return (acc / len(paths)).transpose(2, 0, 1).copy()


def decode_clips(wavs: list[Path], frames: list[list[Path]], root: Path, p: CremaDParams) -> dict[str, torch.Tensor]:
    """Unstandardized ``audio`` ``[M, n_mels, frames]`` and ``image`` ``[M, C, S, S]`` of the clips,
    cached by the settings and the files' names, sizes and modification times."""
    from mmfl.data.cache import cached

    files = list(wavs) + [f for fs in frames for f in fs]
    settings = {"rate": p.sample_rate, "window": p.window, "n_mels": p.n_mels, "frames": p.frames,
                "n_fft": p.n_fft, "mel": "htk", "window_fit": "centre crop/pad", "channels": p.channels,
                "image_size": p.image_size, "num_frames": p.num_frames, "resize": "bilinear",
                "n_wavs": len(wavs), "frames_per_clip": [len(fs) for fs in frames],
                "files": stat_fingerprint(files, root)}

    def compute():
        from mmfl.data.cache import announce, progress

        announce(f"computing log-mel spectrograms and face frames of {len(wavs):,} CREMA-D clips", "crema_d")
        mels = []
        starts = range(0, len(wavs), CHUNK)
        for s in progress(starts, len(starts), f"chunk of {CHUNK} clips", "CREMA-D audio"):
            w = np.stack([fit_window(read_wav_mono(path, p.sample_rate), p.window) for path in wavs[s:s + CHUNK]])
            mels.append(log_mel(torch.from_numpy(w), p.sample_rate, p.n_mels, p.frames, p.n_fft))
        images = np.stack([read_frames(fs, p.channels, p.image_size)
                           for fs in progress(frames, len(frames), "clip", "CREMA-D frames")]) if frames else \
            np.zeros((0, p.channels, p.image_size, p.image_size), dtype=np.float32)
        audio = torch.cat(mels) if mels else torch.zeros(0, p.n_mels, p.frames)
        return {"audio": audio, "image": torch.from_numpy(images)}

    return cached("crema_d", [], settings, compute)


@DATASETS.register("crema_d", CremaDParams,
                   help="CREMA-D emotions from your copy: face frame [C,S,S] + log-mel [1,n_mels,frames], "
                        "6 classes, one client per actor (natural)")
def crema_d(p: CremaDParams) -> DatasetBundle:
    """CREMA-D: ``image`` ``[N, C, S, S]`` + ``audio`` ``[N, 1, n_mels, frames]``, 6 emotions."""
    root = Path(p.root).expanduser()
    wav_dir = root / "AudioWAV"
    if not wav_dir.is_dir():
        raise DataError(f"{wav_dir}: CREMA-D AudioWAV folder not found (data.root must hold AudioWAV/ "
                        f"and {p.frames_dir}/)")
    frames_root = root / p.frames_dir
    if not frames_root.is_dir():
        raise DataError(f"{frames_root}: frames folder not found (extract one frame per second of each "
                        "VideoFlash clip into <frames_dir>/<clip>/*.jpg, or set data.frames_dir)")
    train_csv, test_csv = root / "train.csv", root / "test.csv"
    ignored = 0
    if train_csv.is_file() and test_csv.is_file():
        split_rule = "train.csv / test.csv"
        lists = {"train": read_split_csv(train_csv, wav_dir), "test": read_split_csv(test_csv, wav_dir)}
        both = {c for c, _ in lists["train"]} & {c for c, _ in lists["test"]}
        if both:
            raise DataError(f"{test_csv}: {len(both)} clip(s) also in train.csv, e.g. {sorted(both)[0]}")
        test_actors = sorted({parse_clip(c)[0] for c, _ in lists["test"]})
    else:
        clips = []
        for path in sorted(wav_dir.glob("*.wav")):
            parsed = parse_clip(path.stem)
            if parsed is None or parsed[1] not in EMOTIONS:
                ignored += 1
                continue
            clips.append((path.stem, EMOTIONS.index(parsed[1]), parsed[0]))
        if not clips:
            raise DataError(f"{wav_dir}: no CREMA-D clips (<ActorID>_<Sentence>_<Emotion>_<Level>.wav)")
        actors = sorted({a for *_, a in clips})
        if len(actors) < 2:
            raise DataError(f"{wav_dir}: a split by actor needs >= 2 actors, found {len(actors)} "
                            "(or provide train.csv and test.csv)")
        k = min(max(int(round(len(actors) * p.test_fraction)), 1), len(actors) - 1)
        test_actors = sorted(np.random.default_rng(p.seed).permutation(actors)[:k].tolist())
        test_set = set(test_actors)
        split_rule = f"by actor: {k} of {len(actors)} actors in test (seed {p.seed})"
        lists = {"train": [(c, y) for c, y, a in clips if a not in test_set],
                 "test": [(c, y) for c, y, a in clips if a in test_set]}

    kept, skipped = {}, {}
    wavs, frames = [], []
    for split, items in lists.items():
        kept[split], skipped[split] = [], 0
        for clip, y in items:
            fs = frame_files(frames_root / clip, p.num_frames)
            if not fs:
                if not p.skip_incomplete:
                    raise DataError(f"{frames_root / clip}: no frames for clip {clip} "
                                    "(set data.skip_incomplete = true to skip such clips)")
                skipped[split] += 1
                continue
            kept[split].append((clip, y))
            wavs.append(wav_dir / f"{clip}.wav")
            frames.append(fs)
        if not kept[split]:
            raise DataError(f"{root}: no usable {split} clips (clips with a wav and frames)")
    arrays = decode_clips(wavs, frames, root, p)
    n_tr = len(kept["train"])
    mean, std, (a_tr, a_te) = standardize_scalar(arrays["audio"][:n_tr], arrays["audio"][n_tr:])
    img = arrays["image"]
    y_tr = torch.tensor([y for _, y in kept["train"]], dtype=torch.int64)
    y_te = torch.tensor([y for _, y in kept["test"]], dtype=torch.int64)
    train_actors = sorted({parse_clip(c)[0] for c, _ in kept["train"]}, key=lambda a: (len(a), a))
    actor_id = {a: i for i, a in enumerate(train_actors)}
    client_ids = torch.tensor([actor_id[parse_clip(c)[0]] for c, _ in kept["train"]], dtype=torch.int64)
    meta = DatasetMeta(
        name="crema_d", num_classes=len(EMOTIONS),
        modalities={"image": (p.channels, p.image_size, p.image_size), "audio": (1, p.n_mels, p.frames)},
        class_names=list(EMOTIONS),
        info={"source": str(root), "pairing": "instance", "split": split_rule,
              "test_actors": list(test_actors), "client_names": train_actors,
              "skipped": skipped, "ignored_wavs": ignored,
              "clips": {"train": n_tr, "test": len(kept["test"])},
              "audio": {"sample_rate": p.sample_rate, "window_samples": p.window, "n_fft": p.n_fft,
                        "hop": hop_for(p.window, p.frames), "mel_scale": "htk", "log": "log(mel + 1e-6)"},
              "image": {"frames": "middle" if p.num_frames == 1 else f"mean of {p.num_frames} evenly spaced",
                        "range": "[0, 1]"},
              "standardize": {"audio": {"mean": mean, "std": std, "over": "train clips"}}},
    )
    return DatasetBundle(
        train=ArrayDataset({"image": img[:n_tr], "audio": a_tr.unsqueeze(1)}, y_tr),
        test=ArrayDataset({"image": img[n_tr:], "audio": a_te.unsqueeze(1)}, y_te),
        meta=meta, client_ids=client_ids)
