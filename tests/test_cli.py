"""The ``mmfl`` command, in-process: user errors are one line and exit code 2;
list/help/partition/report/demo print and write what they promise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mmfl.cli import main
from mmfl.data import DATASETS

TINY = """\
name = "tiny"
seed = 0
rounds = 2
threads = 1

[data]
name = "digits"

[partition]
name = "dirichlet"
num_clients = 3
beta = 0.5

[model]
name = "mlp"
hidden = [16]

[algorithm]
name = "fedavg"

[train]
local_epochs = 1
batch_size = 128
optimizer = "sgd"
lr = 0.05
"""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def out_dir(tmp_path) -> str:
    return f"output_dir={tmp_path / 'runs'}"


def run_ok(capsys, argv) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def assert_user_error(capsys, argv, *fragments) -> str:
    """Exit code 2, exactly one stderr line ``mmfl: error: ...`` naming ``fragments``."""
    rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mmfl: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("overrides,fragments", [
    (["algorithm.name=fedsgdx"], ["unknown algorithm 'fedsgdx'", "fedavg"]),
    (["algorithm.name=moon", "algorithm.mux=1"], ["algorithm.mux", "did you mean 'mu'"]),
    (["partition.beta=-1"], ["partition.beta", "-1"]),
    (["sample_fraction=1.5"], ["sample_fraction", "1.5"]),
    (["sample_fraction=0"], ["sample_fraction", "(0, 1]"]),
    (["partition.num_clients=100000"], ["partition.num_clients", "100000"]),
    (["rounds=0"], ["rounds"]),
    (["train.lr=\"fast\""], ["train.lr", "fast"]),
    (["bogus_key=1"], ["bogus_key", "unknown config key"]),
    (["model.name=mlp", "model.hidden=[0]"], ["model.hidden"]),
], ids=["unknown-algorithm", "unknown-key", "beta", "fraction-high", "fraction-zero", "too-many-clients",
        "rounds", "lr-type", "top-level-key", "hidden"])
def test_bad_config_values_are_one_line_errors(tmp_path, tiny, capsys, overrides, fragments):
    argv = ["run", str(tiny), "--no-progress", "--set", out_dir(tmp_path)]
    for o in overrides:
        argv += ["--set", o]
    assert_user_error(capsys, argv, *fragments)
    assert not (tmp_path / "runs" / "tiny" / "metrics.jsonl").exists()


def test_missing_and_corrupt_config_files(tmp_path, capsys):
    missing = tmp_path / "nope.toml"
    assert_user_error(capsys, ["run", str(missing)], str(missing), "not found")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[data\nname = ')
    assert_user_error(capsys, ["run", str(bad)], str(bad), "not valid TOML")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_user_error(capsys, ["run", str(binary)], str(binary))


def test_missing_and_corrupt_data_files(tmp_path, tiny, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    base = ["run", str(tiny), "--no-progress", "--set", out_dir(tmp_path), "--set", "data.name=mnist_idx"]
    assert_user_error(capsys, [*base, "--set", f"data.root={empty}"], str(empty), "train-images-idx3-ubyte")
    assert_user_error(capsys, [*base, "--set", f"data.root={tmp_path / 'absent'}"], "absent", "not found")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (garbage / name).write_bytes(b"this is not an IDX file at all")
    assert_user_error(capsys, [*base, "--set", f"data.root={garbage}"], "train-images-idx3-ubyte", "not an IDX file")
    # data.root is required for mnist_idx
    assert_user_error(capsys, base, "root")


def test_existing_run_folder_needs_resume_or_overwrite(tmp_path, tiny, capsys):
    argv = ["run", str(tiny), "--no-progress", "--set", out_dir(tmp_path), "--set", "rounds=1"]
    run_ok(capsys, argv)
    metrics = tmp_path / "runs" / "tiny" / "metrics.jsonl"
    before = metrics.read_bytes()
    assert len(before.splitlines()) == 1
    assert_user_error(capsys, argv, "run folder exists", "--resume", "--overwrite")
    assert metrics.read_bytes() == before
    # --overwrite replaces it (same seed: same row apart from timings)
    run_ok(capsys, [*argv, "--overwrite"])
    strip = lambda b: {k: v for k, v in json.loads(b).items() if not k.endswith("_time_s")}  # noqa: E731
    assert strip(metrics.read_bytes()) == strip(before)
    # --resume with a changed config names the changed key; the folder is untouched
    assert_user_error(capsys, [*argv, "--resume", "--set", "algorithm.name=fedprox"],
                      "config differs", "algorithm", "only 'rounds'")
    assert_user_error(capsys, [*argv, "--resume", "--set", "train.lr=0.5"], "train")
    assert metrics.read_bytes() != b"" and len(metrics.read_bytes().splitlines()) == 1
    # --resume with more rounds continues it
    out = run_ok(capsys, [*argv[:-1], "rounds=2", "--resume"])
    assert json.loads(out[: out.rindex("}") + 1])["rounds"] == 2
    assert len(metrics.read_bytes().splitlines()) == 2


def test_resume_of_a_missing_run_folder(tmp_path, tiny, capsys):
    assert_user_error(capsys, ["run", str(tiny), "--resume", "--set", out_dir(tmp_path)],
                      "nothing to resume", str(tmp_path / "runs" / "tiny"))


def test_report_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert_user_error(capsys, ["report", str(tmp_path)], "not a run folder")


# ----------------------------------------------------------------------------- list / help

ALGOS = ("fedavg", "fedprox", "scaffold", "moon", "local", "centralized")


def test_list_prints_every_algorithm_and_its_parameters(capsys):
    out = run_ok(capsys, ["list"])
    for name in ALGOS:
        assert re.search(rf"^  {name}\s", out, re.M), name
    assert re.search(r"^\s+tau \(float, default 0\.5\)", out, re.M)
    assert re.search(r"^\s+mu \(float, default 0\.01\)", out, re.M)  # FedProx's mu
    assert re.search(r"^\s+mu \(float, default 1\.0\)", out, re.M)  # MOON's mu
    for header in ("algorithms (", "datasets (", "partitions (", "modality assigners ([modalities]", "cases (",
                   "models (", "run settings", "[train]"):
        assert header in out
    for name in ("mfeat", "digits", "dirichlet", "mlp", "local_epochs", "sample_fraction", "fedcmi", "av_mnist"):
        assert name in out


def test_list_algorithm_prints_only_algorithms(capsys):
    out = run_ok(capsys, ["list", "algorithm"])
    for name in ALGOS:
        assert re.search(rf"^  {name}\s", out, re.M), name
    for other in ("datasets (", "partitions (", "modality assigners (", "cases (", "models (", "run settings",
                  "[train]", "mfeat", "dirichlet"):
        assert other not in out


def test_list_modality_prints_assigners_and_cases(capsys):
    from mmfl.data.modality import CASES, MODALITY_ASSIGNERS

    out = run_ok(capsys, ["list", "modality"])
    assert out.startswith("modality assigners ([modalities] name = ...):")
    for e in MODALITY_ASSIGNERS.entries():
        assert re.search(rf"^  {e.name}\s+{re.escape(e.help)}$", out, re.M), e.name
    assert {e.name for e in MODALITY_ASSIGNERS.entries()} >= {"all", "mixed", "explicit"}
    assert re.search(r"^\s+multimodal_fraction \(float, default 0\.5\)", out, re.M)
    assert re.search(r"^\s+split \('balanced' \| 'random', default \"balanced\"\)", out, re.M)
    assert re.search(r"^\s+holds \(list of list of str, default \[\]\)", out, re.M)
    assert re.search(r"^\s+missing_rate \(dict, default \{\}\)", out, re.M)
    assert 'case = "A".."D"' in out
    for case, preset in CASES.items():  # one line per case naming its two tables
        line = next(x for x in out.splitlines() if x.startswith(f"  {case}  "))
        assert f'[partition] name = "{preset["partition"]["name"]}"' in line
        assert f'[modalities] name = "{preset["modalities"]["name"]}"' in line
    assert 'beta = 5.0' in next(x for x in out.splitlines() if x.startswith("  D  "))
    for other in ("algorithms (", "datasets (", "models (", "fedavg"):
        assert other not in out


def test_run_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--set" in out and "--resume" in out and "--overwrite" in out


# ----------------------------------------------------------------------------- partition / report

def test_partition_prints_counts_summing_to_train_size(tmp_path, tiny, capsys):
    png = tmp_path / "part.png"
    out = run_ok(capsys, ["partition", str(tiny), "--plot", str(png)])
    n_train = len(DATASETS.get("digits").factory(DATASETS.params("digits", {})).train)
    rows = [line.split() for line in out.splitlines()]
    clients = [r for r in rows if r and r[0].isdigit() and len(r) == 12]  # client, 10 classes, total
    assert [int(r[0]) for r in clients] == [0, 1, 2]
    for r in clients:
        assert sum(int(v) for v in r[1:11]) == int(r[11])
    assert sum(int(r[11]) for r in clients) == n_train
    all_row = next(r for r in rows if r and r[0] == "all")
    assert int(all_row[-1]) == n_train
    assert "3 clients, 10 classes" in out
    assert png.read_bytes()[:8] == PNG_MAGIC


MULTIMODAL = """\
name = "mm"
seed = 0
rounds = 1
threads = 1

[data]
name = "mfeat"
views = ["pix", "fou"]

[partition]
name = "dirichlet"
num_clients = 4
beta = 5.0

[modalities]
name = "explicit"
holds = [["pix", "fou"], ["fou"], ["pix"], ["pix"]]

[model]
name = "multimodal"
feat_dim = 8
mlp_hidden = [16]

[algorithm]
name = "mfedavg"

[train]
local_epochs = 1
batch_size = 64
optimizer = "sgd"
lr = 0.05
"""


def modality_rows(out: str) -> dict[str, int]:
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("modalities ("))
    rows = {}
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        combo, n = line.split()
        rows[combo] = int(n)
    return rows


def test_partition_prints_modality_combinations(tmp_path, tiny, capsys):
    from mmfl.config import load_config
    from mmfl.data.modality import modality_summary
    from mmfl.data.federation import build_federation

    cfg = tmp_path / "mm.toml"
    cfg.write_text(MULTIMODAL)
    out = run_ok(capsys, ["partition", str(cfg)])
    assert "4 clients, 10 classes" in out
    assert "modalities (explicit): clients holding each combination" in out
    assert modality_rows(out) == {"fou": 1, "pix": 2, "pix+fou": 1}
    assert "missing_rate" not in out
    # case D (mixed): the counts are the federation's, and sum to the clients; a missing rate is shown
    over = ["--set", 'case="D"', "--set", 'modalities={name = "mixed", missing_rate = {pix = 0.25}}']
    out = run_ok(capsys, ["partition", str(cfg), *over])
    fed = build_federation(load_config(cfg, [o for o in over if o != "--set"]))
    assert modality_rows(out) == modality_summary(fed.client_modalities)
    assert sum(modality_rows(out).values()) == 4 and "modalities (mixed)" in out
    assert "missing_rate (share of each multimodal client's samples lacking it): pix 0.25" in out
    # no modality heterogeneity: no modality lines
    out = run_ok(capsys, ["partition", str(tiny)])
    assert "modalities (" not in out and "missing_rate" not in out


def test_report_adds_per_modality_accuracy_and_uar(tmp_path, tiny, capsys):
    cfg = tmp_path / "mm.toml"
    cfg.write_text(MULTIMODAL)
    run_ok(capsys, ["run", str(cfg), "--no-progress", "--set", out_dir(tmp_path)])
    run_ok(capsys, ["run", str(tiny), "--no-progress", "--set", out_dir(tmp_path), "--set", "rounds=1"])
    runs = tmp_path / "runs"
    out = run_ok(capsys, ["report", str(runs / "mm"), str(runs / "tiny")])
    table = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    header = [c.strip("| ") for c in table[0]]
    assert header == ["run", "algorithm", "rounds", "final acc", "best acc", "acc/fou", "acc/pix", "UAR",
                      "bytes up", "bytes down", "s/round"]
    cells = {row[0].strip("| "): dict(zip(header, [c.strip("| ") for c in row])) for row in table[1:]}
    final = json.loads((runs / "mm" / "metrics.jsonl").read_text().splitlines()[-1])
    mm = cells["mm"]
    assert mm["algorithm"] == "mfedavg"
    for col, key in (("acc/fou", "accuracy/fou"), ("acc/pix", "accuracy/pix"), ("UAR", "uar"),
                     ("final acc", "accuracy")):
        assert mm[col] == f"{100 * final[key]:.2f}%", col
    plain = cells["tiny"]  # a unimodal run has none of them
    assert plain["acc/fou"] == plain["acc/pix"] == plain["UAR"] == "-"
    assert re.match(r"\d+\.\d\d%$", plain["final acc"])
    # runs without per-modality metrics keep the plain table
    out = run_ok(capsys, ["report", str(runs / "tiny")])
    plain_header = "| run | algorithm | rounds | final acc | best acc | bytes up | bytes down | s/round |"
    assert out.splitlines()[0] == plain_header


def test_run_draws_accuracy_png_only_with_plot_or_from_report(tmp_path, tiny, capsys):
    base = ["run", str(tiny), "--no-progress", "--set", out_dir(tmp_path), "--set", "rounds=1"]
    run_ok(capsys, [*base, "--set", "name=lazy"])
    d = tmp_path / "runs" / "lazy"
    assert (d / "summary.json").is_file() and not (d / "accuracy.png").exists()
    out = run_ok(capsys, ["report", str(d)])  # one run: its own accuracy.png
    assert f"plot: {d / 'accuracy.png'}" in out.splitlines()
    assert (d / "accuracy.png").read_bytes()[:8] == PNG_MAGIC
    out = run_ok(capsys, [*base, "--set", "name=eager", "--plot"])
    assert f"plot: {tmp_path / 'runs' / 'eager' / 'accuracy.png'}" in out.splitlines()
    assert (tmp_path / "runs" / "eager" / "accuracy.png").read_bytes()[:8] == PNG_MAGIC


def test_report_compares_two_runs(tmp_path, tiny, capsys):
    base = ["run", str(tiny), "--no-progress", "--set", out_dir(tmp_path), "--set", "rounds=1"]
    run_ok(capsys, [*base, "--set", "name=alpha"])
    run_ok(capsys, [*base, "--set", "name=beta", "--set", "algorithm.name=fedprox"])
    png = tmp_path / "cmp.png"
    runs = tmp_path / "runs"
    out = run_ok(capsys, ["report", str(runs / "alpha"), str(runs / "beta"), "--plot", str(png)])
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| run | algorithm |")
    assert re.search(r"^\| alpha \| fedavg \| 1 \| \d+\.\d\d% \|", out, re.M)
    assert re.search(r"^\| beta \| fedprox \| 1 \| \d+\.\d\d% \|", out, re.M)
    assert png.read_bytes()[:8] == PNG_MAGIC


# ----------------------------------------------------------------------------- demo

def test_demo_runs_end_to_end(tmp_path, capsys):
    # the demo's own local_epochs (2): with 2 rounds of 1 epoch it reaches only ~45 %
    out = run_ok(capsys, ["demo", "--no-progress", "--set", "rounds=2", "--set", "threads=1",
                          "--set", f"output_dir={tmp_path}"])
    for algo in ("fedavg", "moon"):
        d = tmp_path / f"demo-{algo}"
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [1, 2]
        assert rows[0]["clients"] == 10
        summary = json.loads((d / "summary.json").read_text())
        assert summary["algorithm"] == algo and summary["data"] == "mfeat" and summary["rounds"] == 2
        assert summary["final_accuracy"] > 0.5
        assert not (d / "accuracy.png").exists()  # a run draws no plot (the demo draws demo.png)
        assert f'name = "{algo}"' in (d / "config.toml").read_text()
        assert (d / "checkpoints" / "LATEST").read_text().strip() == "round_00002"  # rounds completed
        assert (d / "checkpoints" / "round_00002" / "server.safetensors").is_file()
        assert f"| demo-{algo} | {algo} | 2 |" in out
    assert (tmp_path / "demo.png").read_bytes()[:8] == PNG_MAGIC
