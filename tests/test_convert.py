"""``mmfl convert`` (mmfl/convert.py): UEA/UCR ``.ts`` files -> a manifest, with modalities cut by
channel groups, time windows (steps or shares of the length) and derived channels (first
difference, FFT magnitude); regression targets and malformed files are refused with one line.
The ``.ts`` fixtures are written here (the format is text); a converted univariate set trains."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmfl.cli import main

ROOT = Path(__file__).resolve().parents[1]


def write_ts(path: Path, series, labels, header: str | None = None) -> Path:
    """A .ts file: ``series`` a list of [C, T] arrays (T may vary), ``labels`` strings (None: unlabelled)."""
    classes = " ".join(sorted({str(v) for v in labels if v is not None}))
    head = header if header is not None else (f"@problemName toy\n@timeStamps false\n@univariate "
                                              f"{str(len(series[0]) == 1).lower()}\n@classLabel true {classes}\n")
    lines = ["# a test fixture", head.rstrip("\n"), "@data"]
    for x, y in zip(series, labels):
        chans = ":".join(",".join(f"{v:g}" for v in c) for c in np.asarray(x))
        lines.append(chans if y is None else f"{chans}:{y}")
    path.write_text("\n".join(lines) + "\n")
    return path


def univariate(n: int, t: int, seed: int):
    """Two classes of a univariate series: a rising or a falling ramp in its second half, plus noise."""
    rng = np.random.default_rng(seed)
    ys = [str(1 + i % 2) for i in range(n)]
    xs = []
    for y in ys:
        ramp = np.linspace(0, 1, t // 2) * (1 if y == "1" else -1)
        xs.append(np.round(np.concatenate([np.zeros(t - t // 2), ramp])[None] + 0.1 * rng.standard_normal((1, t)), 3))
    return xs, ys


def convert(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["convert", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def manifest(out: Path) -> list[dict]:
    with open(out / "manifest.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_time_windows_and_derived_channels_of_a_univariate_series(tmp_path, capsys):
    xs, ys = univariate(12, 20, 0)
    tx, ty = univariate(6, 20, 1)
    tr, te = write_ts(tmp_path / "T_TRAIN.ts", xs, ys), write_ts(tmp_path / "T_TEST.ts", tx, ty)
    out = tmp_path / "m"
    rc, said, _ = convert(capsys, tr, te, out, "--modality", "early=t:0-10", "--modality", "late=t:10-",
                          "--derive", "diff", "--derive", "fft:late")
    assert rc == 0 and "18 rows, 2 classes" in said
    rows = manifest(out)
    assert list(rows[0]) == ["label", "early", "late", "early_diff", "late_diff", "late_fft", "split"]
    assert [r["split"] for r in rows] == ["train"] * 12 + ["test"] * 6 and [r["label"] for r in rows] == ys + ty
    for r, x in zip(rows, [*xs, *tx]):
        x = x.astype(np.float32)
        early, late = np.load(out / r["early"]), np.load(out / r["late"])
        np.testing.assert_array_equal(early, x[:, :10])
        np.testing.assert_array_equal(late, x[:, 10:])
        np.testing.assert_allclose(np.load(out / r["early_diff"]), np.diff(x[:, :10], axis=1), rtol=1e-6)
        np.testing.assert_allclose(np.load(out / r["late_diff"]), np.diff(x[:, 10:], axis=1), rtol=1e-6)
        np.testing.assert_allclose(np.load(out / r["late_fft"]), np.abs(np.fft.rfft(x[:, 10:], axis=1)), rtol=1e-5)
        assert np.load(out / r["late_fft"]).shape == (1, 6) and np.load(out / r["early"]).dtype == np.float32


def test_shares_of_the_length_cut_variable_length_series_and_the_manifest_trains(tmp_path, capsys):
    rng = np.random.default_rng(0)
    lengths = [16, 20, 24, 18, 22, 20] * 10
    xs, ys = [], []
    for i, t in enumerate(lengths):
        y = i % 2
        x = rng.standard_normal((1, t)) * 0.1
        x[0, t // 2:] += 1.0 if y else -1.0  # the class is in the second half only
        xs.append(np.round(x, 3))
        ys.append("up" if y else "down")
    tr = write_ts(tmp_path / "V_TRAIN.ts", xs[:40], ys[:40])
    te = write_ts(tmp_path / "V_TEST.ts", xs[40:], ys[40:])
    out = tmp_path / "v"
    rc, _, _ = convert(capsys, tr, te, out, "--modality", "first=t:0-50%", "--modality", "second=t:50%-100%")
    assert rc == 0
    for r, x in zip(manifest(out), xs):
        t = x.shape[1]
        assert np.load(out / r["first"]).shape == (1, t // 2) and np.load(out / r["second"]).shape == (1, t - t // 2)
    import mmfl

    res = mmfl.run({"name": "conv", "output_dir": str(tmp_path / "runs"), "rounds": 3, "threads": 1,
                    "data": {"name": "manifest", "root": str(out), "max_length": 12},
                    "partition": {"name": "iid", "num_clients": 2}, "model": {"name": "multimodal", "feat_dim": 8},
                    "algorithm": {"name": "mfedavg"},
                    "train": {"local_epochs": 2, "batch_size": 8, "optimizer": "adam", "lr": 0.01}}, progress=False)
    assert res.class_names == ["down", "up"]
    assert set(res.federation().meta.modalities) == {"first", "second"}
    assert res.metrics["accuracy"].iloc[-1] >= 0.9  # the second half separates the classes


def test_channel_groups_and_crop_are_the_scripts_and_one_file_has_no_split(tmp_path, capsys):
    rng = np.random.default_rng(3)
    xs = [np.round(rng.standard_normal((4, 30)), 3) for _ in range(8)]
    ys = ["a", "b"] * 4
    tr, te = write_ts(tmp_path / "M_TRAIN.ts", xs[:6], ys[:6]), write_ts(tmp_path / "M_TEST.ts", xs[6:], ys[6:])
    args = ["--modality", "acc=0-1", "--modality", "gyro=2,3", "--crop", "10", "--seed", "4"]
    assert convert(capsys, tr, te, tmp_path / "cli", *args)[0] == 0
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ts_to_manifest.py"), str(tr), str(te),
                    str(tmp_path / "script"), *args], check=True, env=env, capture_output=True)
    rows = manifest(tmp_path / "cli")
    assert rows == manifest(tmp_path / "script")
    for r, x in zip(rows, xs):
        acc, gyro = np.load(tmp_path / "cli" / r["acc"]), np.load(tmp_path / "script" / r["gyro"])
        assert 10 <= acc.shape[1] <= 30 and acc.shape == gyro.shape and acc.shape[0] == gyro.shape[0] == 2
        w = acc.shape[1]
        starts = [s for s in range(31 - w) if np.array_equal(x[:2, s:s + w].astype(np.float32), acc)]
        assert starts and np.array_equal(x[2:, starts[0]:starts[0] + acc.shape[1]].astype(np.float32), gyro)
    assert convert(capsys, tr, tmp_path / "one")[0] == 0
    assert list(manifest(tmp_path / "one")[0]) == ["label", "series"]  # the manifest's test_fraction splits it


HEADER = "@problemName toy\n@timeStamps false\n@univariate true\n"
HINT = ("or pass --label-type class to take each distinct value as a class (and load the manifest with "
        "data.label_type = \"class\")")
BAD = {
    "targetlabel": (HEADER + "@targetLabel true\n", [0.5, 1.25], "has regression targets (@targetLabel true); "
                    "mmfl trains classifiers"),
    "float labels": (HEADER, [0.5, 1.25], "series 0: label '0.5' is not a whole number: 2 of 2 labels have a "
                     "fractional part, so the column holds continuous values (a regression target?); mmfl trains "
                     f"classifiers: bin the values into classes, {HINT}"),
    "no labels": (HEADER + "@classLabel false\n", [None, None], "has no class labels (@classLabel false); "
                  "mmfl trains classifiers"),
    "many integers": (HEADER, list(range(12)), ": 12 distinct numeric labels for 12 labelled rows (more than half "
                      "the rows: fewer than 2 rows per class): a regression target or an id, not classes? bin the "
                      f"values into classes, {HINT}"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_regression_targets_are_refused_with_one_line(tmp_path, capsys, case):
    header, labels, said = BAD[case]
    xs = [np.arange(6.0)[None] + i for i in range(len(labels))]
    f = write_ts(tmp_path / "R.ts", xs, labels, header=header)
    rc, _, err = convert(capsys, f, tmp_path / "out")
    assert rc == 2 and err.splitlines() == [f"mmfl: error: {f}{'' if said[0] == ':' else ' '}{said}"]
    assert not (tmp_path / "out" / "manifest.csv").exists()
    if case == "many integers":  # integer labels that are classes after all
        assert convert(capsys, f, tmp_path / "out", "--label-type", "class")[0] == 0


LABEL_SETS = {  # label columns around the loader's bars (mmfl.data.labels: MANY_DISTINCT, MIN_DISTINCT)
    "9 distinct of 9": [str(i) for i in range(9)],  # under MIN_DISTINCT: a tiny set keeps its classes
    "10 distinct of 10": [str(i) for i in range(10)],
    "10 distinct of 20": [str(i % 10) for i in range(20)],  # exactly half the rows: classes
    "11 distinct of 20": [str(i % 11) for i in range(20)],
    "integer-valued floats": [f"{i % 12}.0" for i in range(12)],
    "a fraction": ["1", "2", "1.5", "1", "2", "1"],
    "numbers and names": ["1", "2", "a", "1", "2", "b"],
    "names": ["a", "b", "c", "a"],
    "declared but continuous": ["0.25", "0.5", "0.25", "0.5"],
}


@pytest.mark.parametrize("case", sorted(LABEL_SETS))
def test_convert_refuses_exactly_the_labels_the_manifest_loader_refuses(tmp_path, capsys, case):
    """One rule (mmfl.data.labels.check_label_column), not a copy: convert each label set with
    ``--label-type class`` (kept whatever they are), load the manifest with the default
    ``label_type = "auto"``; plain ``mmfl convert`` must refuse exactly when that load does, over the
    series of both files together, as the manifest holds them."""
    from mmfl.data.manifest import ManifestParams, load_manifest
    from mmfl.errors import DataError

    labels = LABEL_SETS[case]
    xs = [np.arange(6.0)[None] + i for i in range(len(labels))]
    half = len(labels) // 2
    tr = write_ts(tmp_path / "L_TRAIN.ts", xs[:half], labels[:half])
    te = write_ts(tmp_path / "L_TEST.ts", xs[half:], labels[half:])
    assert convert(capsys, tr, te, tmp_path / "kept", "--label-type", "class")[0] == 0
    try:
        load_manifest(ManifestParams(root=str(tmp_path / "kept"), normalize=False))
        loader_refuses = False
    except DataError:
        loader_refuses = True
    rc, _, err = convert(capsys, tr, te, tmp_path / "auto")
    assert (rc == 2) == loader_refuses, (case, err)
    if loader_refuses:
        assert len(err.splitlines()) == 1 and "--label-type class" in err, err
        assert not (tmp_path / "auto" / "manifest.csv").exists()


def test_crop_windows_are_derived_per_recording(tmp_path, capsys):
    """``--crop``'s window of a recording comes from ``derive_seed(seed, "convert-crop", split, i)``:
    the same seed gives the same windows, another seed others, and the window is that draw."""
    from mmfl.seeds import derive_seed

    rng = np.random.default_rng(5)
    xs = [np.round(rng.standard_normal((1, 40)), 3) for _ in range(6)]
    tr = write_ts(tmp_path / "C_TRAIN.ts", xs, ["a", "b"] * 3)

    def windows(out, seed):
        assert convert(capsys, tr, tmp_path / out, "--crop", "8", "--seed", seed)[0] == 0
        return [np.load(tmp_path / out / r["series"]) for r in manifest(tmp_path / out)]

    first, again, other = windows("a", 7), windows("b", 7), windows("c", 8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(first, other))
    for i, (x, w) in enumerate(zip(xs, first)):
        r = np.random.default_rng(derive_seed(7, "convert-crop", "data", i))
        t = int(r.integers(8, 41))
        start = int(r.integers(0, 40 - t + 1))
        assert np.array_equal(w, x[:, start:start + t].astype(np.float32))


def _bad_file(tmp_path, text: str) -> Path:
    f = tmp_path / "B.ts"
    f.write_text(HEADER + "@classLabel true 1 2\n@data\n" + text)
    return f


@pytest.mark.parametrize("rows,argv,said", [
    ("1,2,?:1\n", [], "B.ts:6: missing values ('?'); mmfl convert needs complete numeric series"),
    ("1,2,3:1,2:1\n", [], "B.ts:6: channels of different lengths (3, 2)"),
    ("1,2,3:1\n1,2,3:4,5,6:2\n", [], "B.ts:7: 2 channels, the first row has 1"),
    ("1,2,3:7\n", [], "B.ts: label '7' is not among @classLabel's classes (1 2)"),
    ("1,2,3:1\n", ["--modality", "x=1"], "--modality x=1: channel 1 does not exist (B.ts series 0 has 1: 0-0)"),
    ("1,2,3:1\n", ["--modality", "x=t:5-"], "--modality x=t:5-: the window is empty for B.ts series 0 (3 steps)"),
    ("1,2,3:1\n", ["--modality", "x=t:0"], "--modality 'x=t:0': expected NAME=SPEC"),
    ("1,2,3:1\n", ["--modality", "label=0"], "--modality 'label=0': the name must be"),
    ("1,2,3:1\n", ["--derive", "log"], "--derive 'log': unknown kind (known: diff, fft"),
    ("1,2,3:1\n", ["--derive", "diff:acc"], "--derive 'diff:acc': no modality 'acc' (modalities: series)"),
])
def test_bad_files_and_values_are_one_line(tmp_path, capsys, rows, argv, said):
    f = _bad_file(tmp_path, rows)
    rc, _, err = convert(capsys, f, tmp_path / "out", *argv)
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("mmfl: error: ") and said in err, err


def test_wrong_paths_are_one_line(tmp_path, capsys):
    rc, _, err = convert(capsys, tmp_path / "nope.ts", tmp_path / "out")
    assert rc == 2 and err.strip() == f"mmfl: error: {tmp_path / 'nope.ts'}: file not found"
    rc, _, err = convert(capsys, tmp_path / "a.ts", tmp_path / "b.ts", tmp_path / "c.ts", tmp_path / "out")
    assert rc == 2 and err.strip() == "mmfl: error: convert: expected TRAIN.ts [TEST.ts] OUT, got 4 paths"
