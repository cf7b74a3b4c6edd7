"""food101 (UPMC Food-101) on a tiny fixture in the released layout (texts/<split>_titles.csv +
images/<split>/<class>/<file>.jpg), with the fast "pixels" / "hash" encoders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mmfl.data.featurize as fz
import mmfl.data.food101 as food
from mmfl.data import DATASETS
from mmfl.data.captions import read_image
from mmfl.errors import ConfigError, DataError

try:
    from data_fixtures import FOOD101_CLASSES, write_food101_dir
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import FOOD101_CLASSES, write_food101_dir

FAST = {"image_encoder": "pixels:4", "text_encoder": "hash:64", "image_size": 32}


def load(**values):
    return DATASETS.get("food101").factory(DATASETS.params("food101", values))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "cache"))


def test_food101_shapes_labels_and_pairing(tmp_path):
    fx = write_food101_dir(tmp_path / "upmc")
    b = load(root=str(fx["dir"]), **FAST)
    assert b.meta.name == "food101" and b.meta.class_names == sorted(FOOD101_CLASSES) and b.meta.num_classes == 3
    assert b.meta.modalities == {"image": (16,), "text": (64,)} and b.meta.info["pairing"] == "instance"
    assert (len(b.train), len(b.test)) == (9, 6) and b.public is None and b.client_ids is None
    assert b.meta.info["header_skipped"] == {"train": False, "test": False}
    for split, ds in (("train", b.train), ("test", b.test)):
        rows = fx[split]  # the CSV's order is kept
        assert b.meta.info["files"][split] == [f"{c}/{f}" for f, _, c in rows]
        assert ds.labels.dtype == torch.int64
        assert ds.labels.tolist() == [b.meta.class_names.index(c) for _, _, c in rows]
        assert ds.features["image"].dtype == torch.float32 and ds.features["text"].shape == (len(rows), 64)
        # text: the CSV's text (quotes and comma kept, whitespace collapsed) through the text encoder
        texts = [" ".join(t.split()) for _, t, _ in rows]
        assert texts[0].endswith('page 0, "best" recipe ever')
        assert torch.allclose(ds.features["text"], fz.text_features(texts, "hash:64"))
        # image: each row's own JPEG (read like the caption sets) through the image encoder
        imgs = np.stack([read_image(fx["dir"] / "images" / split / c / f, 32) for f, _, c in rows])
        assert torch.allclose(ds.features["image"], fz.image_features(imgs, "pixels:4", size=32))
        assert len(torch.unique(ds.features["image"], dim=0)) == len(rows)  # distinct images


def test_food101_header_subsets_and_max_words(tmp_path):
    plain = write_food101_dir(tmp_path / "a")
    write_food101_dir(tmp_path / "b", header=True)
    bom = tmp_path / "a" / "texts" / "test_titles.csv"  # no header: the BOM precedes a file name
    bom.write_text("\ufeff" + bom.read_text(encoding="utf-8"), encoding="utf-8")  # a byte-order mark
    a = load(root=str(plain["dir"]), **FAST)
    b = load(root=str(tmp_path / "b"), **FAST)
    assert b.meta.info["header_skipped"] == {"train": True, "test": True}
    assert torch.equal(a.train.labels, b.train.labels) and torch.allclose(a.test.features["text"],
                                                                         b.test.features["text"])
    # seeded subsets, stratified by class
    s = load(root=str(plain["dir"]), **FAST, max_train=6, max_test=3, seed=1)
    assert (len(s.train), len(s.test)) == (6, 3)
    assert np.bincount(s.train.label_array()).tolist() == [2, 2, 2] and sorted(s.test.label_array()) == [0, 1, 2]
    files = s.meta.info["files"]["train"]
    assert set(files) < set(a.meta.info["files"]["train"])
    rows = [a.meta.info["files"]["train"].index(f) for f in files]
    assert rows == sorted(rows)  # file order kept
    assert torch.equal(s.train.features["image"], a.train.features["image"][rows])
    assert load(root=str(plain["dir"]), **FAST, max_train=6, max_test=3, seed=1).meta.info["files"] == \
        s.meta.info["files"]
    assert any(load(root=str(plain["dir"]), **FAST, max_train=6, seed=k).meta.info["files"]["train"] != files
               for k in range(2, 6))
    # max_words: the first words only
    w = load(root=str(plain["dir"]), **FAST, max_words=3)
    assert torch.allclose(w.train.features["text"][:1], fz.text_features(["train apple pie"], "hash:64"))


def test_food101_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.root: required for food101"):
        DATASETS.params("food101", {})
    with pytest.raises(ConfigError, match="data.max_train"):
        DATASETS.params("food101", {"root": "x", "max_train": -1})
    with pytest.raises(ConfigError, match="unknown image encoder"):
        DATASETS.params("food101", {"root": "x", "image_encoder": "vit"})
    with pytest.raises(DataError, match="UPMC Food-101 folder not found"):
        load(root=str(tmp_path / "nope"), **FAST)

    def fresh(name, **kw):
        fx = write_food101_dir(tmp_path / name, **kw)
        return fx, Path(fx["dir"])

    def fails(root, match, **kw):
        with pytest.raises(DataError, match=match) as e:
            load(root=str(root), **FAST, **kw)
        assert "\n" not in str(e.value)
        return str(e.value)

    fx, root = fresh("nocsv")
    (root / "texts" / "test_titles.csv").unlink()
    assert "test_titles.csv" in fails(root, "text file not found")

    fx, root = fresh("noimg")
    (root / "images" / "train" / "waffles" / "waffles_1.jpg").unlink()
    msg = fails(root, "image file not found")
    assert "waffles_1.jpg" in msg and "1 of 9 train images missing" in msg and "skip_missing_images" in msg
    b = load(root=str(root), **FAST, skip_missing_images=True)
    assert len(b.train) == 8 and b.meta.info["skipped_missing_images"] == {"train": 1, "test": 0}
    assert "waffles/waffles_1.jpg" not in b.meta.info["files"]["train"]

    fx, root = fresh("nofolder")
    import shutil

    shutil.rmtree(root / "images" / "test")
    fails(root, "image folder of split test not found")

    fx, root = fresh("short")
    csv_path = root / "texts" / "train_titles.csv"
    lines = csv_path.read_text().splitlines()
    lines[3] = "apple_pie_9.jpg,apple_pie"
    csv_path.write_text("\n".join(lines) + "\n")
    fails(root, r"train_titles.csv: line 4: expected 'image file,text,class', got 2 field")

    fx, root = fresh("slash")
    csv_path = root / "texts" / "test_titles.csv"
    csv_path.write_text(csv_path.read_text().replace("apple_pie_0.jpg", "../apple_pie_0.jpg", 1))
    fails(root, "line 1: expected an image file name and a class name")

    fx, root = fresh("unknown")
    csv_path = root / "texts" / "test_titles.csv"
    csv_path.write_text(csv_path.read_text() + 'sushi_0.jpg,"raw fish",sushi\n')
    fails(root, "class 'sushi' does not occur in train_titles.csv")

    fx, root = fresh("empty")
    (root / "texts" / "train_titles.csv").write_text("\n\n")
    fails(root, "train_titles.csv: no rows")

    fx, root = fresh("binary")
    (root / "texts" / "train_titles.csv").write_bytes(b"a.jpg,\xff\xfe bad,apple_pie\n")
    fails(root, "cannot read CSV")

    fx, root = fresh("long")  # a page text longer than csv's default 128 KiB field limit is read
    csv_path = root / "texts" / "train_titles.csv"
    csv_path.write_text(csv_path.read_text().replace("best", "word " * 40000, 1))
    assert len(load(root=str(root), **FAST).train) == 9

    fx, root = fresh("badjpeg")
    (root / "images" / "test" / "pad_thai" / "pad_thai_1.jpg").write_bytes(b"not a jpeg")
    fails(root, "pad_thai_1.jpg: cannot read the image")


def test_food101_features_are_cached(tmp_path, monkeypatch):
    fx = write_food101_dir(tmp_path / "upmc")
    first = load(root=str(fx["dir"]), **FAST)
    assert any((tmp_path / "cache" / "food101").glob("*.safetensors"))

    def boom(*a, **k):
        raise AssertionError("images decoded again")

    monkeypatch.setattr(food, "read_image", boom)
    again = load(root=str(fx["dir"]), **FAST)  # from the cache: no image is read
    for split in ("train", "test"):
        a, b = getattr(first, split), getattr(again, split)
        assert torch.equal(a.features["image"], b.features["image"]) and torch.equal(a.labels, b.labels)
    with pytest.raises(AssertionError, match="decoded again"):  # other settings: computed anew
        load(root=str(fx["dir"]), **{**FAST, "image_encoder": "pixels:3"})
    monkeypatch.undo()
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "cache"))
    # a rewritten image changes the key (file stats), so its features are recomputed
    import os

    path = Path(fx["dir"]) / "images" / "train" / "pad_thai" / "pad_thai_0.jpg"
    from PIL import Image

    Image.fromarray(np.full((18, 24, 3), 250, dtype=np.uint8)).save(path, quality=95)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    changed = load(root=str(fx["dir"]), **FAST)
    row = changed.meta.info["files"]["train"].index("pad_thai/pad_thai_0.jpg")
    assert not torch.equal(changed.train.features["image"][row], first.train.features["image"][row])
    feat = changed.train.features["image"][row]
    assert float((feat - 250 / 255).abs().max()) < 0.03  # the new, uniformly bright image
