"""Missing modalities per row in a manifest: empty cells (CSV, JSONL, Parquet None/NaN) and cells
naming missing files load as zeros with ``present/<m>`` masks and one line per modality;
``data.missing = "error"`` refuses them; rows with no label or no modality are dropped by rule;
normalize, sequences and text encoders leave absent rows out; the bad-input lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmfl.data import DATASETS
from mmfl.data.base import LENGTH, PRESENT
from mmfl.errors import DataError

try:
    from data_fixtures import write_manifest
except ImportError:  # tests/ imported as a package
    from tests.data_fixtures import write_manifest


def load(**values):
    return DATASETS.get("manifest").factory(DATASETS.params("manifest", values))


def _rows(tmp_path):
    """10 rows: x inline [3], f a .npy [2, 4] file; rows 5 (no modality) and 6 (no label) are dropped."""
    for i in range(10):
        np.save(tmp_path / f"f{i}.npy", np.full((2, 4), i + 1, np.float32))
    rows = [{"x": f"{i} {i + 1} {i + 2}", "f": f"f{i}.npy", "label": "ab"[i % 2], "split": "train"} for i in range(8)]
    rows += [{"x": f"{i} 0 1", "f": f"f{i}.npy", "label": "ab"[i % 2], "split": "test"} for i in (8, 9)]
    rows[0]["x"] = ""  # train: x missing
    rows[2]["x"] = " "
    rows[1]["f"] = "gone.npy"  # train: f names a file that does not exist
    rows[4].update(x="", f="")  # no modality at all: dropped
    rows[5]["label"] = ""  # no label: dropped
    rows[9]["x"] = ""  # test: x missing
    return rows


def test_empty_cells_and_missing_files_load_as_zeros_with_masks_and_one_line_per_modality(tmp_path, capsys):
    write_manifest(tmp_path / "m.csv", _rows(tmp_path))
    b = load(root=str(tmp_path), manifest="m.csv", normalize=False)  # the values as stored
    err = capsys.readouterr().err.strip().splitlines()
    assert len(b.train) == 6 and len(b.test) == 2  # rows 5 and 6 left out
    assert err == [
        "mmfl: note: manifest: 1 of 10 rows have no label and are left out (rows 6; data.unlabelled = \"drop\": "
        "no algorithm here trains on unlabelled rows yet)",
        "mmfl: note: manifest: 1 of 10 rows have no modality at all (every modality cell empty or a missing file) "
        "and are left out (rows 5)",
        "mmfl: note: manifest: 3 of 8 rows (37.5 %) lack 'x' (train 2, test 1); they train and evaluate with "
        "present/x masks",
        f"mmfl: note: manifest: 1 of 8 rows (12.5 %) lack 'f' (train 1); 1 of them name a file that does not exist, "
        f"e.g. {tmp_path / 'gone.npy'}; they train and evaluate with present/f masks"]
    tr, te = b.train.features, b.test.features
    assert tr[PRESENT + "x"].tolist() == [False, True, False, True, True, True]  # rows 1, 2, 3, 4, 7, 8
    assert tr[PRESENT + "f"].tolist() == [True, False, True, True, True, True]
    assert te[PRESENT + "x"].tolist() == [True, False] and PRESENT + "f" not in te  # every test row has f
    assert tr["x"].dtype == torch.float32 and tr["x"].shape == (6, 3) and tr["f"].shape == (6, 2, 4)
    assert tr["x"][0].tolist() == [0, 0, 0] and tr["x"][1].tolist() == [1, 2, 3] and te["x"][1].tolist() == [0] * 3
    assert torch.all(tr["f"][1] == 0) and torch.all(tr["f"][0] == 1)
    assert b.train.labels.tolist() == [0, 1, 0, 1, 0, 1] and b.meta.modalities == {"x": (3,), "f": (2, 4)}


def test_missing_error_refuses_the_first_absent_cell_naming_row_column_and_option(tmp_path):
    rows = _rows(tmp_path)
    write_manifest(tmp_path / "m.csv", rows)
    with pytest.raises(DataError, match=r"m\.csv: row 1, column 'x': empty cell \(data\.missing = \"error\"; the "
                                        r"default \"allow\" loads the row with present/x = False\)"):
        load(root=str(tmp_path), manifest="m.csv", missing="error")
    rows[0]["x"] = rows[2]["x"] = rows[4]["x"] = "1 2 3"
    write_manifest(tmp_path / "m.csv", rows)
    with pytest.raises(DataError, match=r"row 2, column 'f': file not found: .*gone\.npy \(data\.missing"):
        load(root=str(tmp_path), manifest="m.csv", missing="error")
    with pytest.raises(DataError, match=r"row 6, column 'label': empty cell \(data\.unlabelled = \"error\""):
        load(root=str(tmp_path), manifest="m.csv", unlabelled="error")


def test_parquet_none_and_nan_cells_and_a_stored_image_without_its_file_are_missing(tmp_path, capsys):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def png(v):
        buf = io.BytesIO()
        Image.fromarray(np.full((4, 4), v, np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    n = 12
    seq = [[float(i), float(i) + 1] for i in range(n)]
    seq[3] = None
    num = [float(i) for i in range(n)]
    num[4] = float("nan")
    img = [{"bytes": png(10 * i), "path": f"p{i}.png"} for i in range(n)]
    img[5] = {"bytes": None, "path": "gone.png"}  # neither bytes nor file: missing
    img[6] = None
    table = pa.table({"seq": seq, "num": num, "img": img, "label": [i % 3 for i in range(n)],
                      "split": ["train"] * 9 + ["test"] * 3})
    pq.write_table(table, tmp_path / "m.parquet")
    b = load(root=str(tmp_path), manifest="m.parquet", image_mode="L", normalize=False)  # the values as stored
    tr = b.train.features
    assert tr[PRESENT + "seq"].tolist() == [i != 3 for i in range(9)]
    assert tr[PRESENT + "num"].tolist() == [i != 4 for i in range(9)]
    assert tr[PRESENT + "img"].tolist() == [i not in (5, 6) for i in range(9)]
    assert not any(k.startswith(PRESENT) for k in b.test.features)
    assert tr["seq"][3].tolist() == [0, 0] and tr["num"][4].tolist() == [0] and torch.all(tr["img"][5] == 0)
    assert tr["img"].shape == (9, 1, 4, 4) and float(tr["img"][2, 0, 0, 0]) == pytest.approx(20 / 255)
    err = capsys.readouterr().err
    assert "1 of 12 rows (8.3 %) lack 'seq' (train 1);" in err
    assert f"2 of 12 rows (16.7 %) lack 'img' (train 2); 1 of them name a file that does not exist, " \
           f"e.g. {tmp_path / 'gone.png'}" in err


def test_normalize_uses_present_train_rows_only_and_absent_rows_stay_zero(tmp_path):
    rows = [{"x": f"{v} {2 * v}", "z": 1, "label": i % 2, "split": "train"} for i, v in enumerate([1, 3, 5, 7])]
    rows += [{"x": "", "z": 1, "label": 0, "split": "train"}, {"x": "100 100", "z": 1, "label": 1, "split": "test"},
             {"x": "", "z": 1, "label": 0, "split": "test"}]
    write_manifest(tmp_path / "m.csv", rows)
    b = load(root=str(tmp_path), manifest="m.csv", normalize=["x"])
    st = b.meta.info["standardize"]["x"]
    assert st["mean"] == pytest.approx([4.0, 8.0]) and st["std"] == pytest.approx([np.std([1, 3, 5, 7])] * 1 +
                                                                                   [np.std([2, 6, 10, 14])])
    assert b.train.features["x"][4].tolist() == [0, 0] and b.test.features["x"][1].tolist() == [0, 0]
    assert b.test.features["x"][0, 0] == pytest.approx((100 - 4) / np.std([1, 3, 5, 7]))


def test_sequences_and_token_texts_of_absent_rows_are_zeros_of_length_one(tmp_path):
    rows = [{"s": [[float(i)] * (3 + i % 3)], "t": f"word{i} shared", "label": i % 2, "split": "train"}
            for i in range(6)]
    rows += [{"s": [[1.0, 2.0]], "t": "shared", "label": 0, "split": "test"}]
    rows[1]["s"] = None
    rows[2]["t"] = ""
    write_manifest(tmp_path / "m.jsonl", rows)
    b = load(root=str(tmp_path), manifest="m.jsonl", max_length=4, text_encoder="tokens", normalize=["s"])
    tr = b.train.features
    assert tr["s"].shape == (6, 1, 4) and torch.all(tr["s"][1] == 0) and tr[LENGTH + "s"].tolist() == [3, 1, 4, 3, 4, 4]
    assert tr["t"][2].tolist() == [0] * 64 and tr[LENGTH + "t"][2] == 1
    assert "word2" not in b.meta.info["vocab"]["t"]  # the absent text is no text, not even a vocabulary entry
    assert torch.isfinite(tr["s"]).all()


def test_a_length_column_and_pad_skip_absent_rows(tmp_path):
    rows = [{"s": [1.0] * (2 + i), "n": 2 + i, "x": i, "label": i % 2, "split": "train" if i < 4 else "test"}
            for i in range(6)]
    rows[1].update(s=None, n=None)  # no sequence, no length
    write_manifest(tmp_path / "m.jsonl", rows)
    b = load(root=str(tmp_path), manifest="m.jsonl", pad=True)
    assert b.train.features["s"].shape == (4, 1, 7) and b.train.features[LENGTH + "s"].tolist() == [2, 1, 4, 5]
    b = load(root=str(tmp_path), manifest="m.jsonl", pad=True, length_column={"s": "n"})
    assert b.train.features[LENGTH + "s"].tolist() == [2, 1, 4, 5] and b.test.features[LENGTH + "s"].tolist() == [6, 7]


def test_frozen_text_encoders_never_see_absent_cells(tmp_path, monkeypatch):
    import mmfl.data.featurize as fz

    seen = []
    real = fz.text_features

    def spy(texts, encoder, *a, **k):
        seen.append(list(texts))
        return real(texts, encoder, *a, **k)

    monkeypatch.setattr(fz, "text_features", spy)
    rows = [{"t": "" if i in (1, 4) else f"text number {i}", "x": f"{i} 1", "label": i % 2,
             "split": "test" if i > 5 else "train"} for i in range(8)]
    write_manifest(tmp_path / "m.csv", rows)
    b = load(root=str(tmp_path), manifest="m.csv", text_encoder="hash:16", normalize=False)  # raw hashed vectors
    assert seen == [[f"text number {i}" for i in range(8) if i not in (1, 4)]]
    assert b.train.features["t"].shape == (6, 16) and torch.all(b.train.features["t"][1] == 0)
    assert torch.all(b.train.features["t"][0] != 0) or b.train.features["t"][0].norm() > 0


def test_rename_renames_the_masks(tmp_path):
    rows = [{"tweet": "" if i == 0 else f"w{i}", "x": i, "label": i % 2, "split": "train" if i < 4 else "test"}
            for i in range(6)]
    write_manifest(tmp_path / "m.csv", rows)
    b = load(root=str(tmp_path), manifest="m.csv", text_encoder="hash:8", rename={"tweet": "text"})
    assert set(b.train.features) == {"text", "x", PRESENT + "text"} and set(b.test.features) == {"text", "x"}


# ---------------------------------------------------------------- bad input

def test_bad_input_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "zero.npy").write_bytes(b"")
    np.save(tmp_path / "ok.npy", np.ones(3, np.float32))
    np.save(tmp_path / "wide.npy", np.ones(4, np.float32))
    np.save(tmp_path / "words.npy", np.array(["a", "b"]))
    base = [{"x": "ok.npy", "y": "1 2", "label": "a", "split": "train"},
            {"x": "ok.npy", "y": "3 4", "label": "b", "split": "train"},
            {"x": "ok.npy", "y": "5 6", "label": "a", "split": "test"}]

    def err(rows, match, **kw):
        write_manifest(tmp_path / "m.csv", rows)
        with pytest.raises(DataError, match=match):
            load(root=str(tmp_path), manifest="m.csv", **kw)

    err(base + [dict(base[0], x="zero.npy")], r"row 4, column 'x': .*zero\.npy: empty file \(0 bytes\); leave the "
                                              r"cell empty to mark the modality missing")
    err([dict(base[0], x=""), base[1], dict(base[0], x="wide.npy"), base[2]],
        r"row 3, column 'x': ragged shapes: \(4,\) here, \(3,\) in row 2")  # the first row holding x
    err(base + [dict(base[0], x="words.npy")], r"row 4, column 'x': .*words\.npy: dtype <U1 is not numeric")
    err([dict(r, y="") if r["split"] == "train" else r for r in base],
        r"m\.csv: column 'y': every train row lacks it \(2 empty cells or missing files\)")
    capsys.readouterr()
    write_manifest(tmp_path / "m.csv", [*base[:2], dict(base[2], y="")])
    load(root=str(tmp_path), manifest="m.csv")
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines[-1] == ("mmfl: warning: manifest: no test row has 'y' (all 1 lack it): test accuracy says "
                             "nothing about how the model uses 'y'")


def test_a_client_lacking_a_modality_on_every_row_is_named_in_one_warning(tmp_path, capsys):
    from mmfl.config import resolve
    from mmfl.data.federation import build_federation

    rows = [{"x": f"{i} 1", "y": "" if k == "c2" else f"{i} 2", "label": i % 2, "client": k, "split": "train"}
            for i in range(12) for k in [("c1", "c2", "c3")[i % 3]]]
    rows += [{"x": "1 1", "y": "1 1", "label": i % 2, "client": "", "split": "test"} for i in range(4)]
    write_manifest(tmp_path / "m.csv", rows)
    cfg = resolve({"name": "x", "data": {"name": "manifest", "root": str(tmp_path), "manifest": "m.csv"},
                   "partition": {"name": "natural"}, "model": {"name": "multimodal", "feat_dim": 4},
                   "algorithm": {"name": "mfedavg"}, "output_dir": str(tmp_path / "runs")})
    fed = build_federation(cfg)
    assert fed.clients[1].features[PRESENT + "y"][fed.clients[1].indices].sum() == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "every row" in ln]
    assert lines == ["mmfl: warning: 1 of 3 clients lack 'y' on every row (client 1 (c2)): they train no 'y' encoder "
                     "on their own data"]
