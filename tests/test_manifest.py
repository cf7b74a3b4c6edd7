"""The manifest data set's options: text encoders, sequences (max_length), normalize, labels,
the public split, test rows without a client, and the load-time checks naming file/row/column."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmfl.data import DATASETS
from mmfl.data.base import LENGTH
from mmfl.data.manifest import ManifestParams
from mmfl.errors import ConfigError, DataError

try:
    from data_fixtures import write_manifest, write_png
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import write_manifest, write_png


def load(**values):
    return DATASETS.get("manifest").factory(DATASETS.params("manifest", values))


def err(tmp_path, rows, match, name="m.jsonl", exc=DataError, **kw):
    write_manifest(tmp_path / name, rows)
    with pytest.raises(exc, match=match):
        load(root=str(tmp_path), manifest=name, **kw)


# ---------------------------------------------------------------- text encoders

TEXT_ROWS = [("the cat sat", "pets", "a", "train"), ("a dog ran far", "pets", "b", "train"),
             ("cat and dog", "zoo", "a", "train"), ("!!!", "zoo", "b", "train"),
             ("the zebra sat", "zoo", "", "test"), ("dog", "pets", "", "test")]


def _text_manifest(tmp_path, name="m.jsonl"):
    rows = [{"caption": c, "title": t, "label": i % 2, "client": k, "split": s}
            for i, (c, t, k, s) in enumerate(TEXT_ROWS)]
    write_manifest(tmp_path / name, rows)
    return name


def test_text_encoder_per_column_hash_and_tokens_with_train_vocabulary(tmp_path):
    name = _text_manifest(tmp_path)
    b = load(root=str(tmp_path), manifest=name, text_encoder={"caption": "tokens", "title": "hash:16"},
             text_max_tokens=3, normalize=False)  # the raw hashed vectors (the default z-scores them)
    assert b.meta.modalities == {"caption": (3,), "title": (16,)}
    ids, lengths = b.train.features["caption"], b.train.features[LENGTH + "caption"]
    assert ids.dtype == torch.int64 and lengths.dtype == torch.int64
    vocab = b.meta.info["vocab"]["caption"]
    assert b.meta.info["token_vocab_size"] == {"caption": len(vocab)}
    assert "zebra" not in vocab  # test rows do not feed the vocabulary
    assert ids[0].tolist() == [vocab["the"], vocab["cat"], vocab["sat"]] and lengths.tolist() == [3, 3, 3, 1]
    assert ids[3].tolist() == [1, 0, 0]  # no word token: one <unk>, length 1
    assert b.test.features["caption"][0].tolist() == [vocab["the"], 1, vocab["sat"]]
    title = b.train.features["title"]
    assert title.dtype == torch.float32 and torch.allclose(title.norm(dim=1), torch.ones(4))  # L2-normalised
    assert torch.equal(title[0], title[1])  # the same title "pets" -> the same hashed vector
    assert LENGTH + "title" not in b.train.features
    assert b.meta.info["text_encoder"] == {"caption": "tokens", "title": "hash:16"}
    # one name for every text column; a capped vocabulary
    b = load(root=str(tmp_path), manifest=name, text_encoder="tokens", text_vocab_size=4)
    assert b.meta.info["token_vocab_size"] == {"caption": 4, "title": 4}
    # rename: a column becomes the modality another data set names alike (options keep column names)
    b = load(root=str(tmp_path), manifest=name, text_encoder={"caption": "tokens", "title": "hash:8"},
             rename={"caption": "text"})
    assert b.meta.modalities == {"text": (64,), "title": (8,)} and LENGTH + "text" in b.train.features
    assert b.meta.info["token_vocab_size"] == {"text": len(b.meta.info["vocab"]["text"])}
    assert b.meta.info["columns"] == {"text": "caption", "title": "title"}
    with pytest.raises(ConfigError, match=r"data.rename.nope: not a modality column"):
        load(root=str(tmp_path), manifest=name, text_encoder="hash", rename={"nope": "text"})
    with pytest.raises(ConfigError, match=r"data.rename: two modalities would be named alike"):
        load(root=str(tmp_path), manifest=name, text_encoder="hash", rename={"caption": "title"})


def test_text_encoder_errors_name_the_field(tmp_path):
    name = _text_manifest(tmp_path)
    with pytest.raises(ConfigError, match=r"data.text_encoder: unknown text encoder 'bert'.*'tokens'"):
        load(root=str(tmp_path), manifest=name, text_encoder="bert")
    with pytest.raises(ConfigError, match=r"data.text_encoder.title: .*needs|data.text_encoder.title: "):
        load(root=str(tmp_path), manifest=name, text_encoder={"title": "hash:0"})
    with pytest.raises(ConfigError, match=r"data.text_encoder.label: not a text column .*caption, title"):
        load(root=str(tmp_path), manifest=name, text_encoder={"label": "hash"})
    with pytest.raises(ConfigError, match="data.normalize: 'caption' holds token ids"):
        load(root=str(tmp_path), manifest=name, text_encoder="tokens", normalize=["caption"])


# ---------------------------------------------------------------- labels

def test_integer_labels_one_to_nine_are_nine_dense_classes(tmp_path):
    rows = [{"x": f"{i} 1", "label": str(1 + i % 9)} for i in range(27)]
    write_manifest(tmp_path / "m.csv", rows)
    b = load(root=str(tmp_path), manifest="m.csv")
    assert b.meta.num_classes == 9 and b.meta.class_names == [str(i) for i in range(1, 10)]
    assert b.meta.info["label_map"] == {str(i): i - 1 for i in range(1, 10)}
    y = torch.cat([b.train.labels, b.test.labels])
    assert sorted(set(y.tolist())) == list(range(9))
    # numeric order, not string order; names kept as given
    rows = [{"x": f"{i} 1", "label": [10, 2, 33][i % 3]} for i in range(9)]
    write_manifest(tmp_path / "n.jsonl", rows)
    b = load(root=str(tmp_path), manifest="n.jsonl")
    assert b.meta.class_names == ["2", "10", "33"]
    write_manifest(tmp_path / "f.csv", [{"x": f"{i} 1", "label": ["2.0", "10", "33.0"][i % 3]} for i in range(9)])
    assert load(root=str(tmp_path), manifest="f.csv").meta.class_names == ["2", "10", "33"]
    # data.classes fixes the order (and ids) and may name classes absent here
    b = load(root=str(tmp_path), manifest="n.jsonl", classes=["33", "10", "2", "7"], normalize=False)  # raw x
    assert b.meta.num_classes == 4 and b.meta.info["label_map"] == {"33": 0, "10": 1, "2": 2, "7": 3}
    xs = torch.cat([b.train.features["x"][:, 0], b.test.features["x"][:, 0]]).long()
    ys = torch.cat([b.train.labels, b.test.labels])
    assert all(int(y) == {33: 0, 10: 1, 2: 2}[[10, 2, 33][int(i) % 3]] for i, y in zip(xs, ys))
    err(tmp_path, rows, r"row 1, column 'label': label '10' is not in data.classes", name="n.jsonl",
        classes=["2", "33"])


# ---------------------------------------------------------------- sequences

def test_max_length_pads_and_cuts_the_last_axis_and_writes_lengths(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((2, t)).astype(np.float32) for t in (5, 3, 8, 4)]
    for i, s in enumerate(seqs):
        np.save(tmp_path / f"s{i}.npy", s)
    rows = [{"acc": f"s{i}.npy", "hr": list(range(1, 2 + i)), "label": i % 2, "split": "train" if i < 3 else "test"}
            for i in range(4)]
    err(tmp_path, rows, r"row 2, column 'acc': ragged shapes: \(2, 3\) here, \(2, 5\) in row 1 "
                        r"\(set data.max_length")
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length=6, normalize=False)  # the values as stored
    assert b.meta.modalities == {"acc": (2, 6), "hr": (1, 6)}  # a [T] sequence is one channel: [1, T]
    x, lengths = b.train.features["acc"], b.train.features[LENGTH + "acc"]
    assert lengths.tolist() == [5, 3, 6] and b.test.features[LENGTH + "acc"].tolist() == [4]
    assert torch.equal(x[0, :, :5], torch.from_numpy(seqs[0])) and x[0, :, 5:].abs().sum() == 0
    assert torch.equal(x[2], torch.from_numpy(seqs[2][:, :6]))  # "end": the first 6 steps kept
    assert b.train.features[LENGTH + "hr"].tolist() == [1, 2, 3]
    assert b.train.features["hr"][2].tolist() == [[1, 2, 3, 0, 0, 0]]
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length={"acc": 4, "hr": 5}, truncate="start",
             normalize=False)
    assert b.meta.info["max_length"] == {"acc": 4, "hr": 5} and b.meta.modalities == {"acc": (2, 4), "hr": (1, 5)}
    assert torch.equal(b.train.features["acc"][2], torch.from_numpy(seqs[2][:, 4:]))  # the last 4 kept


def test_time_axis_first_reads_time_major_arrays_as_channels_by_time(tmp_path):
    """[T_i, C] files (a table saved row per time step) with time_axis = "first" are [C, T] at
    load, padded on time; without it, the error says which option to set."""
    seqs = [np.arange(3 * t, dtype=np.float32).reshape(t, 3) for t in (4, 2, 5)]
    for i, s in enumerate(seqs):
        np.save(tmp_path / f"s{i}.npy", s)
    rows = [{"acc": f"s{i}.npy", "label": i % 2, "split": "test" if i == 2 else "train"} for i in range(3)]
    err(tmp_path, rows, r"only the last axis \(time\) may differ.*time_axis = 'first'", max_length=5)
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length=5, time_axis="first", normalize=False)
    assert b.meta.modalities == {"acc": (3, 5)} and b.train.features[LENGTH + "acc"].tolist() == [4, 2]
    assert torch.equal(b.train.features["acc"][0, :, :4], torch.from_numpy(seqs[0].T))


def test_max_length_errors(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 5), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((3, 4), np.float32))
    rows = [{"acc": "a.npy", "label": 0}, {"acc": "b.npy", "label": 1}]
    err(tmp_path, rows, r"row 2, column 'acc': shape \(3, 4\) here, \(2, 5\) in row 1: only the last axis",
        max_length=8)
    rows = [{"acc": [[1, 2, 3], [4, 5, 6]], "label": 0}, {"acc": [[1, 2], [3, 4]], "label": 1}]
    b = load(root=str(tmp_path), **{"manifest": write_manifest(tmp_path / "n.jsonl", rows * 3).name},
             max_length=3, test_fraction=0.5)
    assert b.meta.modalities == {"acc": (2, 3)}  # nested inline lists are [C, T]
    err(tmp_path, [{"acc": [[1, 2, 3], [4]], "label": 0}], "ragged nested list")
    err(tmp_path, rows, r"data.max_length.img: not a column this setting applies to", exc=ConfigError, max_length={"img": 3})
    err(tmp_path, rows, r"data.max_length: must be an integer >= 0", exc=ConfigError, max_length=-1)


# ---------------------------------------------------------------- normalize

def test_normalize_uses_train_statistics_per_feature_and_per_channel_over_valid_steps(tmp_path):
    seqs = [np.array([[1.0, 3.0], [10.0, 10.0]]), np.array([[5.0, 7.0, 9.0], [20.0, 20.0, 20.0]]),
            np.array([[100.0], [0.0]])]
    for i, s in enumerate(seqs):
        np.save(tmp_path / f"s{i}.npy", s.astype(np.float32))
    rows = [{"seq": f"s{i}.npy", "v": [float(i), 2.0 * i], "label": i % 2, "split": ["train", "train", "test"][i]}
            for i in range(3)]
    write_manifest(tmp_path / "m.jsonl", rows + [dict(rows[0], split="train")])
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length={"seq": 4}, normalize=True)
    st = b.meta.info["standardize"]
    # channel 0 over the 7 valid train steps (rows 1, 2, 4): 1 3 5 7 9 1 3; padded zeros left out
    ch0 = np.array([1, 3, 5, 7, 9, 1, 3.0])
    assert st["seq"]["per"] == "channel" and np.allclose(st["seq"]["mean"][0], ch0.mean())
    assert np.allclose(st["seq"]["std"][0], ch0.std())
    assert st["v"]["per"] == "feature" and np.allclose(st["v"]["mean"], [1 / 3, 2 / 3])
    x = b.train.features["seq"]
    assert np.isclose(float(x[0, 0, 0]), (1 - ch0.mean()) / ch0.std(), atol=1e-5)
    assert x[0, :, 2:].abs().sum() == 0 and b.test.features["seq"][0, :, 1:].abs().sum() == 0  # pads stay 0
    # the test row uses train statistics
    assert np.isclose(float(b.test.features["seq"][0, 0, 0]), (100 - ch0.mean()) / ch0.std(), atol=1e-4)
    assert np.isclose(float(b.test.features["v"][0, 0]), (2 - st["v"]["mean"][0]) / st["v"]["std"][0], atol=1e-5)
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length=4, normalize=["v"])
    assert list(b.meta.info["standardize"]) == ["v"] and float(b.train.features["seq"][0, 0, 0]) == 1.0
    err(tmp_path, rows, r"data.normalize: 'nope' is not a modality column", exc=ConfigError,
        max_length=4, normalize=["nope"])



def test_normalize_auto_is_the_default_every_column_but_token_ids_and_false_keeps_raw_values(tmp_path):
    """The default ``normalize = "auto"``: tabular, sequence, image and frozen text feature columns
    z-scored with train statistics (docs/recipe.md measures why); token ids never; false: raw."""
    from PIL import Image

    rows = []
    for i in range(8):
        Image.fromarray(np.full((2, 2), 30 * i, np.uint8)).save(tmp_path / f"i{i}.png")
        rows.append({"v": [100.0 * i, 3.0], "seq": [[float(i), 2.0 * i, 1.0]], "img": f"i{i}.png",
                     "h": f"word{i % 3} shared", "t": f"tok{i % 2}", "label": i % 2,
                     "split": "test" if i >= 6 else "train"})
    write_manifest(tmp_path / "m.jsonl", rows)
    enc = {"h": "hash:8", "t": "tokens"}
    b = load(root=str(tmp_path), manifest="m.jsonl", text_encoder=enc, image_mode="L")
    assert ManifestParams(root=".").normalize == "auto"
    assert sorted(b.meta.info["standardize"]) == ["h", "img", "seq", "v"]  # not the token ids "t"
    tr = b.train.features
    assert np.allclose(tr["v"][:, 0].mean(), 0, atol=1e-6) and np.allclose(tr["v"][:, 0].std(unbiased=False), 1)
    assert torch.all(tr["v"][:, 1] == 0)  # a constant feature: std taken as 1, centred
    assert np.isclose(float(b.test.features["v"][0, 0]), (600 - 250) / np.std(100.0 * np.arange(6)), atol=1e-5)
    raw = load(root=str(tmp_path), manifest="m.jsonl", text_encoder=enc, image_mode="L", normalize=False)
    assert "standardize" not in raw.meta.info and raw.train.features["v"][1].tolist() == [100.0, 3.0]
    assert torch.equal(raw.train.features["t"], tr["t"]) and tr["t"].dtype == torch.int64
    assert torch.allclose(raw.train.features["h"].norm(dim=1), torch.ones(6))  # hash vectors as encoded
    err(tmp_path, rows, r"data.normalize: expected \"auto\", true/false or a list", exc=ConfigError,
        text_encoder=enc, normalize="yes")

# ---------------------------------------------------------------- splits and clients

def test_public_rows_and_test_rows_without_a_client(tmp_path):
    rows = [{"x": f"{i} {i % 2}", "t": f"word{i % 3}", "label": ["a", "b"][i % 2], "client": f"c{i % 2}",
             "split": "train"} for i in range(6)]
    rows += [{"x": "1 1", "t": "word1", "label": "b", "client": "", "split": "test"},
             {"x": "2 0", "t": "word2 word0", "label": "", "client": "", "split": "Public"},
             {"x": "3 1", "t": "word0", "label": "a", "client": "", "split": "public"}]
    write_manifest(tmp_path / "m.csv", rows)
    b = load(root=str(tmp_path), manifest="m.csv", text_encoder="tokens", normalize=["x"])
    assert len(b.train) == 6 and len(b.test) == 1 and len(b.public) == 2
    assert set(b.public.features) == set(b.train.features) == {"x", "t", LENGTH + "t"}
    assert b.public.labels.tolist() == [-1, 0]  # an empty public label is -1 (CreamFL does not use them)
    assert b.meta.num_classes == 2 and b.client_ids.tolist() == [0, 1, 0, 1, 0, 1]
    mean, std = b.meta.info["standardize"]["x"]["mean"], b.meta.info["standardize"]["x"]["std"]
    assert np.isclose(float(b.public.features["x"][0, 0]), (2 - mean[0]) / std[0], atol=1e-5)
    assert "word2" in b.meta.info["vocab"]["t"] and b.meta.info["client_names"] == ["c0", "c1"]
    err(tmp_path, [dict(rows[0], client="")] + rows[1:], r"row 1, column 'client': empty cell "
                                                          r"\(every train row needs a client\)", name="m.csv")
    err(tmp_path, rows[:6] + [dict(rows[6], label="")], r"row 7, column 'label': empty cell \(data.unlabelled",
        name="m.csv", unlabelled="error")
    err(tmp_path, rows[:6] + [dict(rows[6], split="dev")], r"must be 'train' or 'test' \(or 'public'", name="m.csv")
    err(tmp_path, rows[:6], r"column 'split': no test rows", name="m.csv")


# ---------------------------------------------------------------- load-time checks

def test_non_finite_empty_and_binary_files_are_named_at_load(tmp_path):
    np.save(tmp_path / "ok.npy", np.ones(3, np.float32))
    bad = np.ones((2, 3), np.float32)
    bad[1, 2] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    np.save(tmp_path / "inf.npy", np.array([1.0, np.inf, 2.0]))
    np.save(tmp_path / "empty.npy", np.zeros((0,), np.float32))
    base = [{"x": "ok.npy", "label": "a", "split": "train"}, {"x": "ok.npy", "label": "b", "split": "test"}]
    for split in ("train", "test"):  # in a train file and in a test file: named at load, not as divergence
        err(tmp_path, base + [{"x": "nan.npy", "label": "a", "split": split}],
            r"m.jsonl: row 3, column 'x': .*nan\.npy: non-finite value nan at index \(1, 2\)")
    for cell, match in (("inf.npy", r".*inf\.npy: non-finite value inf"), ("empty.npy", r".*empty\.npy: empty array"),
                        ("1 nan 3", "inline value: non-finite value nan"), ([1, float("inf"), 3], "inline value")):
        err(tmp_path, base + [{"x": cell, "label": "a", "split": "test"}], r"row 3, column 'x': " + match)
    (tmp_path / "ok.txt").write_text("hello there", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "bin.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    base = [{"t": "ok.txt", "label": "a", "split": "train"}, {"t": "ok.txt", "label": "b", "split": "test"}]
    kw = {"text_encoder": "hash"}
    for name, match in (("empty", "empty text file"), ("bin", "a binary file"), ("latin1", "not UTF-8")):
        err(tmp_path, base + [{"t": f"{name}.txt", "label": "a", "split": "test"}],
            rf"row 3, column 't': .*{name}\.txt: {match}", **kw)


def test_ragged_images_still_point_at_image_size(tmp_path):
    write_png(tmp_path / "a.png", np.zeros((2, 2), np.uint8))
    write_png(tmp_path / "b.png", np.zeros((3, 3), np.uint8))
    err(tmp_path, [{"x": "a.png", "label": 0}, {"x": "b.png", "label": 1}], r"ragged shapes.*set data.image_size")


def test_per_sample_csv_tables_are_sequences_and_unknown_files_are_not_text(tmp_path):
    (tmp_path / "r0.csv").write_text("ax,ay\n1,10\n2,20\n3,30\n", encoding="utf-8")  # rows = steps
    (tmp_path / "r1.csv").write_text("4,40\n5,50\n", encoding="utf-8")  # no header
    (tmp_path / "r2.tsv").write_text("7\t70\n", encoding="utf-8")
    rows = [{"imu": f"r{i}.{'tsv' if i == 2 else 'csv'}", "label": i % 2, "split": ["train", "train", "test"][i]}
            for i in range(3)]
    write_manifest(tmp_path / "m.jsonl", rows)
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length=3, normalize=False)  # the values as stored
    assert b.meta.modalities == {"imu": (2, 3)} and b.meta.info["kinds"] == {"imu": "array"}
    assert b.train.features["imu"][0].tolist() == [[1, 2, 3], [10, 20, 30]]
    assert b.train.features[LENGTH + "imu"].tolist() == [3, 2] and b.test.features["imu"][0, 1, 0] == 70
    (tmp_path / "bad.csv").write_text("1,2\n3,x\n", encoding="utf-8")
    err(tmp_path, rows[:2] + [dict(rows[2], imu="bad.csv")], r"row 3, column 'imu': .*bad\.csv: data line 2")
    (tmp_path / "r3.json").write_text("[1, 2]", encoding="utf-8")
    err(tmp_path, rows[:2] + [dict(rows[2], imu="r3.json")], r"row 3, column 'imu': r3.json: unsupported file type")


def test_image_encoder_gives_frozen_features_and_transparency_is_white(tmp_path):
    """image_encoder = "pixels:<s>" (the cheap frozen encoder; mobilenet_v2 goes through the same
    path): an image column becomes float [s*s] features; a transparent pixel reads as white."""
    from PIL import Image

    rows = []
    for i in range(6):
        rgba = np.zeros((8, 8, 4), dtype=np.uint8)
        rgba[..., 3] = 0 if i % 2 else 255  # odd images: fully transparent (-> white), even: opaque black
        Image.fromarray(rgba, "RGBA").save(tmp_path / f"{i}.png")
        rows.append({"img": f"{i}.png", "label": i % 2, "split": "test" if i >= 4 else "train"})
    write_manifest(tmp_path / "m.jsonl", rows)
    b = load(root=str(tmp_path), manifest="m.jsonl", image_encoder="pixels:4", normalize=False)  # raw features
    assert b.meta.modalities == {"img": (16,)} and b.meta.info["image_encoder"] == {"img": "pixels:4"}
    x = b.train.features["img"]
    assert torch.allclose(x[1], torch.ones(16)) and torch.allclose(x[0], torch.zeros(16))
    raw = load(root=str(tmp_path), manifest="m.jsonl", normalize=False)  # default: pixels kept as [C, H, W]
    assert raw.meta.modalities == {"img": (3, 8, 8)} and float(raw.train.features["img"][1].min()) == 1.0
    with pytest.raises(ConfigError, match=r"data.image_encoder"):
        load(root=str(tmp_path), manifest="m.jsonl", image_encoder="resnet")


def test_pad_true_pads_varying_columns_to_their_longest_and_a_length_column_marks_prepadded_rows(tmp_path):
    """pad = true: every array column whose time axis varies is padded to its longest sequence
    (fixed-length columns are left alone); length_column: the valid lengths of sequences the
    user padded already, read from a column (and not a modality)."""
    rows = [{"acc": list(range(1, 2 + i)), "hr": [i, i], "label": i % 2, "split": "test" if i == 3 else "train"}
            for i in range(4)]
    write_manifest(tmp_path / "m.jsonl", rows)
    b = load(root=str(tmp_path), manifest="m.jsonl", pad=True)
    assert b.meta.modalities == {"acc": (1, 4), "hr": (2,)} and LENGTH + "hr" not in b.train.features
    assert b.train.features[LENGTH + "acc"].tolist() == [1, 2, 3] and b.test.features[LENGTH + "acc"].tolist() == [4]
    pre = [{"acc": [1, 2, 0, 0], "n": 2, "label": i % 2, "split": "test" if i == 3 else "train"} for i in range(4)]
    write_manifest(tmp_path / "pre.jsonl", pre)
    b = load(root=str(tmp_path), manifest="pre.jsonl", length_column="n")
    assert b.meta.modalities == {"acc": (1, 4)} and b.train.features[LENGTH + "acc"].tolist() == [2, 2, 2]
    pre[1]["n"] = 0
    err(tmp_path, pre, r"row 2, column 'n': a length must be an integer >= 1", name="pre.jsonl", length_column="n")
    with pytest.raises(ConfigError, match="data.pad"):
        load(root=str(tmp_path), manifest="m.jsonl", pad=["nope"])
