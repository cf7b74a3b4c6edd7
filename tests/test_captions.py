"""coco_captions, flickr30k and ag_news (mmfl/data/captions.py) on tiny fixtures in the released formats.

The cheap encoders ("pixels:8" images, "hash:64" texts) keep these fast; both give 64-d features.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmfl.data import DATASETS
from mmfl.data.captions import read_image
from mmfl.data.featurize import image_features, text_features
from mmfl.core.retrieval import evaluate_retrieval, pairs_to_retrieval
from mmfl.errors import ConfigError, DataError

try:
    from data_fixtures import write_ag_news_dir, write_coco_dir, write_flickr30k_dir
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import write_ag_news_dir, write_coco_dir, write_flickr30k_dir

CHEAP = {"image_encoder": "pixels:8", "text_encoder": "hash:64", "image_size": 32}


def load(name, **values):
    return DATASETS.get(name).factory(DATASETS.params(name, values))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFL_CACHE_DIR", str(tmp_path / "cache"))


def _check_pairs(b, files_dir, files, captions, split):
    """Rows = captions image by image; image rows repeat per caption; features = the encoders' output."""
    ds = b.test if split == "test" else b.train
    idx = b.meta.info["image_index"][split]
    want_idx = [k for k, cs in enumerate(captions) for _ in cs]
    assert idx.dtype == torch.int64 and idx.tolist() == want_idx
    assert b.meta.info["image_files"][split] == files
    assert len(ds) == len(want_idx) and ds.labels.tolist() == [0] * len(want_idx)
    texts = [c for cs in captions for c in cs]
    assert torch.allclose(ds.features["text"], text_features(texts, "hash:64", cache=False))
    imgs = np.stack([read_image(files_dir / f, 32) for f in files])
    want_img = image_features(imgs, "pixels:8", cache=False)
    assert torch.allclose(ds.features["image"], want_img[torch.tensor(want_idx)])


def test_coco_captions_shapes_pairing_and_retrieval(tmp_path):
    fx = write_coco_dir(tmp_path / "coco", n_train=4, n_test=3, captions=2)
    b = load("coco_captions", root=str(fx["dir"]), **CHEAP)
    assert b.meta.modalities == {"image": (64,), "text": (64,)} and b.meta.num_classes == 1
    assert b.meta.info["pairing"] == "instance"
    for split, name in (("train", "train2017"), ("test", "val2017")):
        _check_pairs(b, fx["dir"] / name, fx[name]["files"], fx[name]["captions"], split)
    assert fx["val2017"]["captions"][0][0] == "a photo number {} variant 0".format(fx["val2017"]["ids"][0])
    # the test split in the form the retrieval metrics take
    img, txt, t2i = pairs_to_retrieval(b.test.features["image"], b.test.features["text"],
                                       b.meta.info["image_index"]["test"])
    assert img.shape == (3, 64) and txt.shape == (6, 64) and t2i.tolist() == [0, 0, 1, 1, 2, 2]
    r = evaluate_retrieval(img, txt, t2i)
    assert r["protocol"] == "plain" and r["i2t_r5"] == 100.0  # 4 other captions: a match is always in the top 5
    # subsets and caption limit; a second load comes from the cache
    b2 = load("coco_captions", root=str(fx["dir"]), max_images=2, captions_per_image=1, **CHEAP)
    assert len(b2.train) == 2 and len(b2.test) == 3
    assert set(b2.meta.info["image_files"]["train"]) <= set(fx["train2017"]["files"])
    b3 = load("coco_captions", root=str(fx["dir"]), **CHEAP)
    assert torch.equal(b3.train.features["image"], b.train.features["image"])
    # CreamFL's public pairs: a seeded subset of the train images with all their captions
    b4 = load("coco_captions", root=str(fx["dir"]), public_images=1, **CHEAP)
    pub, tr = b4.meta.info["image_files"]["public"], b4.meta.info["image_files"]["train"]
    assert len(pub) == 1 and len(tr) == 3 and sorted(pub + tr) == sorted(fx["train2017"]["files"])
    assert len(b4.public) == 2 and len(b4.train) == 6 and b4.meta.info["image_index"]["public"].tolist() == [0, 0]
    k = fx["train2017"]["files"].index(pub[0])
    assert torch.equal(b4.public.features["text"], b.train.features["text"][2 * k:2 * k + 2])
    assert torch.equal(b4.public.features["image"][0], b.train.features["image"][2 * k])
    with pytest.raises(DataError, match="public_images"):
        load("coco_captions", root=str(fx["dir"]), public_images=4, **CHEAP)


def test_coco_captions_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.root"):
        DATASETS.params("coco_captions", {})
    with pytest.raises(ConfigError, match="data.image_encoder"):
        DATASETS.params("coco_captions", {"root": "x", "image_encoder": "resnet"})
    with pytest.raises(ConfigError, match="data.captions_per_image"):
        DATASETS.params("coco_captions", {"root": "x", "captions_per_image": -1})
    fx = write_coco_dir(tmp_path / "coco", n_train=2, n_test=2)
    ann = fx["dir"] / "annotations" / "captions_val2017.json"
    good = ann.read_text()
    ann.write_text(good[:-5])
    with pytest.raises(DataError, match=r"captions_val2017\.json: cannot parse JSON"):
        load("coco_captions", root=str(fx["dir"]), **CHEAP)
    doc = json.loads(good)
    doc["annotations"].append({"image_id": 99999, "caption": "orphan"})
    ann.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"captions_val2017\.json: annotations\[4\]: image_id 99999"):
        load("coco_captions", root=str(fx["dir"]), **CHEAP)
    ann.write_text(json.dumps({"images": []}))
    with pytest.raises(DataError, match="'images' and 'annotations'"):
        load("coco_captions", root=str(fx["dir"]), **CHEAP)
    ann.write_text(good)
    missing = fx["dir"] / "train2017" / fx["train2017"]["files"][1]
    missing.unlink()
    with pytest.raises(DataError, match=f"{missing.name}: image file not found"):
        load("coco_captions", root=str(fx["dir"]), **CHEAP)
    with pytest.raises(DataError, match=r"captions_train2014\.json: COCO captions file not found"):
        load("coco_captions", root=str(fx["dir"]), split_train="train2014", **CHEAP)


def test_flickr30k_karpathy_splits(tmp_path):
    fx = write_flickr30k_dir(tmp_path / "f30k", counts={"train": 4, "val": 1, "test": 3}, captions=2)
    b = load("flickr30k", root=str(fx["dir"]), **CHEAP)
    img_dir = fx["dir"] / "flickr30k-images"
    for split in ("train", "test"):
        items = fx[split]
        _check_pairs(b, img_dir, [f for f, _ in items], [c for _, c in items], split)
    b2 = load("flickr30k", root=str(fx["dir"]), split_train="train+val", captions_per_image=1, **CHEAP)
    assert len(b2.train) == 5 and b2.meta.info["images"] == {"train": 5, "test": 3}
    with pytest.raises(ConfigError, match="data.split_test"):
        DATASETS.params("flickr30k", {"root": "x", "split_train": "train+test"})


def test_flickr30k_errors(tmp_path):
    fx = write_flickr30k_dir(tmp_path / "f30k", counts={"train": 2, "test": 1})
    path = fx["dir"] / "dataset_flickr30k.json"
    good = json.loads(path.read_text())
    bad = json.loads(path.read_text())
    del bad["images"][1]["split"]
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"dataset_flickr30k\.json: images\[1\]"):
        load("flickr30k", root=str(fx["dir"]), **CHEAP)
    path.write_text("not json")
    with pytest.raises(DataError, match=r"dataset_flickr30k\.json: cannot parse JSON"):
        load("flickr30k", root=str(fx["dir"]), **CHEAP)
    path.write_text(json.dumps(good))
    with pytest.raises(DataError, match="no images with captions in split 'val'"):
        load("flickr30k", root=str(fx["dir"]), split_test="val", **CHEAP)
    (fx["dir"] / "flickr30k-images" / fx["test"][0][0]).unlink()
    with pytest.raises(DataError, match=f"{fx['test'][0][0]}: image file not found"):
        load("flickr30k", root=str(fx["dir"]), **CHEAP)


def test_ag_news(tmp_path):
    fx = write_ag_news_dir(tmp_path / "ag", n_train=8, n_test=4)
    b = load("ag_news", root=str(fx["dir"]), text_encoder="hash:64")
    assert b.meta.num_classes == 4 and b.meta.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert b.meta.modalities == {"text": (64,)}
    assert b.train.labels.tolist() == [r % 4 for r in range(8)] and len(b.test) == 4
    want = [" ".join(f"{t} {d}".replace("\\", " ").split()) for _, t, d in fx["train"]]
    assert want[1] == 'train headline 1 Story 1 of class 2, quoted "x" more'
    assert torch.allclose(b.train.features["text"], text_features(want, "hash:64", cache=False))
    b2 = load("ag_news", root=str(fx["dir"]), text_encoder="hash:64", max_train=3)
    assert len(b2.train) == 3
    # a header line is tolerated; a bad class index is a DataError naming file and line
    csv_path = fx["dir"] / "test.csv"
    csv_path.write_text("Class Index,Title,Description\n" + csv_path.read_text())
    assert len(load("ag_news", root=str(fx["dir"]), text_encoder="hash:64").test) == 4
    csv_path.write_text(csv_path.read_text() + '"7","t","d"\n')
    with pytest.raises(DataError, match=r"test\.csv: line 6: expected 'class_index \(1-4\)"):
        load("ag_news", root=str(fx["dir"]), text_encoder="hash:64")
    (fx["dir"] / "train.csv").unlink()
    with pytest.raises(DataError, match=r"train\.csv: AG_NEWS file not found"):
        load("ag_news", root=str(fx["dir"]), text_encoder="hash:64")
    with pytest.raises(ConfigError, match="data.text_encoder"):
        DATASETS.params("ag_news", {"root": "x", "text_encoder": "bert"})
