"""Parquet / Arrow / Feather files and Hugging Face ``datasets`` folders read as manifests
(mmfl.data.tables): real files written by pyarrow and datasets, read back as tensors."""

from __future__ import annotations

import io
import os
import wave

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa  # noqa: E402
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from mmfl.config import apply_overrides
from mmfl.data import DATASETS  # noqa: E402
from mmfl.data.tables import Blob, read_rows, split_value  # noqa: E402
from mmfl.errors import DataError  # noqa: E402

from helpers import run_config

N = 12
RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, size=(N, 4, 5, 3), dtype=np.uint8)
VEC = RNG.standard_normal((N, 3)).astype(np.float32)
GRID = RNG.standard_normal((N, 2, 3)).astype(np.float32)
NAMES = ["cat", "dog", "ant"]
LABELS = [NAMES[i % 3] for i in range(N)]
CLIENTS = [f"c{i % 2}" for i in range(N)]
SPLIT = ["test" if i >= 9 else "train" for i in range(N)]


def load(name="manifest", **values):
    if name == "manifest":  # these tests read back the values as written: no z-scoring (default "auto")
        values.setdefault("normalize", False)
    return DATASETS.get(name).factory(DATASETS.params(name, values))


def png(px: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "PNG")
    return buf.getvalue()


def wav(samples: np.ndarray, rate: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, dtype="<i2").tobytes())
    return buf.getvalue()


def arrow_table() -> pa.Table:
    return pa.table({"label": LABELS, "image": [png(p) for p in PIXELS], "vec": VEC.tolist(),
                     "grid": pa.array(GRID.tolist(), pa.list_(pa.list_(pa.float32(), 3), 2)),
                     "client": CLIENTS, "split": SPLIT})


def check_bundle(b):
    """The bundle of :func:`arrow_table`: labels by name, image/vec/grid tensors equal what was written."""
    tr, te = [i for i in range(N) if SPLIT[i] == "train"], [i for i in range(N) if SPLIT[i] == "test"]
    assert b.meta.class_names == ["ant", "cat", "dog"]
    assert b.train.labels.tolist() == [["ant", "cat", "dog"].index(LABELS[i]) for i in tr]
    assert len(b.test) == len(te)
    assert b.meta.modalities == {"image": (3, 4, 5), "vec": (3,), "grid": (2, 3)}
    assert torch.allclose(b.train.features["image"], torch.from_numpy(PIXELS[tr].transpose(0, 3, 1, 2) / 255.0).float())
    assert torch.equal(b.test.features["vec"], torch.from_numpy(VEC[te]))
    assert torch.equal(b.train.features["grid"], torch.from_numpy(GRID[tr]))
    assert b.meta.info["kinds"] == {"image": "image", "vec": "array", "grid": "array"}
    assert b.client_ids.tolist() == [i % 2 for i in tr]


# ---------------------------------------------------------------- files written by pyarrow

@pytest.mark.parametrize("fmt", ["parquet", "feather", "arrow-file", "arrow-stream"])
def test_parquet_feather_and_arrow_files_read_back_as_the_written_tensors(tmp_path, fmt):
    t = arrow_table()
    name = {"parquet": "d.parquet", "feather": "d.feather", "arrow-file": "d.arrow", "arrow-stream": "d.ipc"}[fmt]
    if fmt == "parquet":
        pq.write_table(t, tmp_path / name)
    elif fmt == "feather":
        feather.write_feather(t, tmp_path / name)  # v2, lz4-compressed
    else:
        with pa.OSFile(str(tmp_path / name), "wb") as sink:
            opener = pa.ipc.new_file if fmt == "arrow-file" else pa.ipc.new_stream
            with opener(sink, t.schema) as w:
                w.write_table(t)
    check_bundle(load(root=str(tmp_path), manifest=name))


def test_pandas_parquet_drops_the_index_and_reads_categoricals_and_decoded_audio(tmp_path):
    pd = pytest.importorskip("pandas")
    x = RNG.uniform(-0.9, 0.9, size=(N, 7))
    df = pd.DataFrame({"label": pd.Categorical(LABELS), "f": VEC[:, 0].astype(np.float64),
                       "sound": [{"array": x[i].tolist(), "sampling_rate": 8000} for i in range(N)]},
                      index=np.arange(N) + 100)  # a non-default index is stored as __index_level_0__
    df.to_parquet(tmp_path / "p.parquet")
    cols, rows = read_rows(tmp_path / "p.parquet")
    assert cols == ["label", "f", "sound"] and isinstance(rows[0]["sound"], Blob)
    b = load(root=str(tmp_path), manifest="p.parquet", audio_length=9, test_fraction=0.25)
    assert b.meta.modalities == {"f": (1,), "sound": (1, 9)}
    got = torch.cat([b.train.features["f"][:, 0], b.test.features["f"][:, 0]])
    order = [int(np.flatnonzero(VEC[:, 0] == v)[0]) for v in got.numpy()]
    snd = torch.cat([b.train.features["sound"], b.test.features["sound"]])[:, 0]
    np.testing.assert_allclose(snd[:, :7].numpy(), x[order], atol=1e-8)  # 32-bit PCM round trip
    assert snd[:, 7:].abs().max() == 0 and b.meta.info["modality_info"]["sound"] == {"sample_rate": 8000}


def test_path_cells_in_a_parquet_are_files_relative_to_root(tmp_path):
    for i in range(N):
        np.save(tmp_path / f"a{i}.npy", GRID[i])
    pq.write_table(pa.table({"label": LABELS, "arr": [f"a{i}.npy" for i in range(N)], "split": SPLIT}),
                   tmp_path / "m.parquet")
    b = load(root=str(tmp_path), manifest="m.parquet")
    assert torch.equal(b.train.features["arr"], torch.from_numpy(GRID[:9]))


# ---------------------------------------------------------------- Hugging Face datasets folders

@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("datasets")


def hf_dataset(hf, rows=range(N)):
    feats = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=NAMES),
                         "vec": hf.Sequence(hf.Value("float32")), "grid": hf.Array2D((2, 3), "float32"),
                         "client": hf.Value("string")})
    rows = list(rows)
    return hf.Dataset.from_dict({"image": [{"bytes": png(PIXELS[i]), "path": f"img{i}.png"} for i in rows],
                                 "label": [i % 3 for i in rows], "vec": VEC[rows].tolist(),
                                 "grid": [GRID[i] for i in rows], "client": [CLIENTS[i] for i in rows]},
                                features=feats)


def test_hf_dataset_dict_folder_maps_splits_images_and_class_names(tmp_path, hf):
    hf.DatasetDict(train=hf_dataset(hf, range(9)), test=hf_dataset(hf, range(9, N))).save_to_disk(tmp_path / "dd")
    b = load(root=str(tmp_path / "dd"), manifest=".")  # the folder itself is the table
    check_bundle(b)
    b2 = load(root=str(tmp_path), manifest="dd")  # or a folder inside root
    assert torch.equal(b2.train.features["image"], b.train.features["image"])


def test_hf_single_dataset_folder_with_audio_and_parquet_export(tmp_path, hf):
    snd = RNG.integers(-3000, 3000, size=(N, 5))
    ds = hf_dataset(hf).add_column("snd", [{"bytes": wav(s), "path": None} for s in snd])
    ds = ds.cast_column("snd", hf.Audio(decode=False))
    ds.save_to_disk(tmp_path / "one")
    ds.to_parquet(tmp_path / "one.parquet")  # datasets' parquet keeps the features (ClassLabel, Image)
    for root, manifest in ((tmp_path / "one", "."), (tmp_path, "one.parquet")):
        b = load(root=str(root), manifest=manifest, audio_length=5, test_fraction=0.25)
        assert b.meta.class_names == ["ant", "cat", "dog"] and len(b.test) == 3
        assert b.meta.info["kinds"]["snd"] == "audio" and b.meta.info["kinds"]["image"] == "image"
        got = torch.cat([b.train.features["snd"], b.test.features["snd"]])[:, 0]
        vec = torch.cat([b.train.features["vec"], b.test.features["vec"]])
        order = [int(np.flatnonzero(VEC[:, 0] == v)[0]) for v in vec[:, 0].numpy()]
        np.testing.assert_allclose(got.numpy(), snd[order] / 32768.0, atol=1e-7)


def test_validation_split_is_the_test_split_only_without_a_test_split(tmp_path, hf, capsys):
    assert split_value("validation", ["train", "validation"]) == "test"
    assert split_value("validation", ["train", "validation", "test"]) is None
    assert split_value("unsupervised", ["train", "test", "unsupervised"]) is None
    hf.DatasetDict(train=hf_dataset(hf, range(9)), validation=hf_dataset(hf, range(9, N))).save_to_disk(tmp_path / "v")
    check_bundle(load(root=str(tmp_path / "v"), manifest="."))
    hf.DatasetDict(train=hf_dataset(hf, range(9)), validation=hf_dataset(hf, range(3)),
                   test=hf_dataset(hf, range(9, N))).save_to_disk(tmp_path / "vt")
    check_bundle(load(root=str(tmp_path / "vt"), manifest="."))
    assert "split(s) validation (3 rows) left out" in capsys.readouterr().err


# ---------------------------------------------------------------- errors: one line naming the file (and column)

def test_corrupt_and_truncated_files_name_the_file(tmp_path):
    pq.write_table(arrow_table(), tmp_path / "good.parquet")
    data = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all" * 10)
    feather.write_feather(arrow_table(), tmp_path / "good.feather")
    (tmp_path / "cut.feather").write_bytes((tmp_path / "good.feather").read_bytes()[:300])
    for name, what in (("cut.parquet", "Parquet"), ("junk.arrow", "Arrow/Feather"), ("cut.feather", "Arrow/Feather")):
        with pytest.raises(DataError, match=f"{name}: not a readable {what} file") as e:
            load(root=str(tmp_path), manifest=name)
        assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="nope.parquet: table not found"):
        load(root=str(tmp_path), manifest="nope.parquet")


def test_unsupported_columns_and_cells_name_file_and_column(tmp_path):
    pq.write_table(pa.table({"label": [0, 1], "s": [{"a": 1}, {"a": 2}]}), tmp_path / "struct.parquet")
    with pytest.raises(DataError, match=r"struct.parquet: row 1, column 's': unsupported column type struct<a: int64> .*\(leave"):
        load(root=str(tmp_path), manifest="struct.parquet")
    pq.write_table(pa.table({"label": [0, 1] * 3, "s": [{"a": 1}] * 6, "v": [1.0, 2.0] * 3}), tmp_path / "unused.parquet")
    b = load(root=str(tmp_path), manifest="unused.parquet", modalities=["v"], test_fraction=0.5)
    assert b.meta.modalities == {"v": (1,)}  # an unsupported column that is not used is no error
    pq.write_table(pa.table({"label": [0, 1], "b": [b"\x00\x01junk", b"zz"]}), tmp_path / "bin.parquet")
    with pytest.raises(DataError, match=r"bin.parquet: row 1, column 'b': binary cell is not an image"):
        load(root=str(tmp_path), manifest="bin.parquet")
    pq.write_table(pa.table({"label": [0, 1], "a": [{"bytes": b"fLaC\x00\x00", "path": "x.flac"}] * 2}),
                   tmp_path / "flac.parquet")
    with pytest.raises(DataError, match=r"flac.parquet: row 1, column 'a': audio bytes are FLAC; mmfl reads PCM WAV only"):
        load(root=str(tmp_path), manifest="flac.parquet")
    bad = png(PIXELS[0])[:20]  # a PNG header, then nothing: fails when decoded, naming row and column
    pq.write_table(pa.table({"label": [0, 1], "img": [png(PIXELS[0]), bad]}), tmp_path / "img.parquet")
    with pytest.raises(DataError, match=r"img.parquet: row 2, column 'img': cannot read the stored bytes as image"):
        load(root=str(tmp_path), manifest="img.parquet")


def test_a_folder_that_is_not_a_datasets_folder_is_one_line(tmp_path, hf):
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="plain: not a Hugging Face datasets folder"):
        load(root=str(tmp_path), manifest="plain")
    hf_dataset(hf).save_to_disk(tmp_path / "ds")
    with pytest.raises(DataError, match=r'datasets folder: set data.manifest = "\."'):
        load(root=str(tmp_path / "ds"))  # the default manifest.csv is not there: say how to read the folder
    (tmp_path / "ds" / "state.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(DataError, match="ds: cannot read the datasets folder"):
        load(root=str(tmp_path / "ds"), manifest=".")


# ---------------------------------------------------------------- end to end

def test_a_parquet_manifest_runs_an_experiment(tmp_path):
    pq.write_table(arrow_table(), tmp_path / "d.parquet")
    raw = apply_overrides({}, ["data.name=manifest", f"data.root={tmp_path}", "data.manifest=d.parquet",
                               "partition.name=natural", "model.name=multimodal", "rounds=1", "threads=1",
                               "train.batch_size=8", "train.local_epochs=1", f"output_dir={tmp_path / 'runs'}", "name=tables"])
    exp = run_config(raw)
    assert (exp.run_dir / "metrics.jsonl").read_text().strip()
