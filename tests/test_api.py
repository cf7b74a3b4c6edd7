"""The Python API (mmfl.api): mmfl.run returns what the run folder holds, load_run reads it
back, overrides spell the CLI's --set, errors are the CLI's one line, and ``import mmfl`` /
the CLI's fast paths import no torch."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
from conftest import patience  # noqa: E402

import mmfl
from mmfl.cli import demo_config_path, main
from mmfl.errors import ConfigError, MMFLError

ROOT = Path(__file__).resolve().parents[1]
DEMO = demo_config_path()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("api-runs")
    return mmfl.run(DEMO, rounds=2, threads=1, output_dir=str(out), progress=False)


def test_run_result_equals_the_run_folder(demo_run):
    res = demo_run
    lines = [json.loads(line) for line in res.metrics_path.read_text().splitlines()]
    assert len(res.metrics) == 2 == len(lines)  # one row per round
    pd.testing.assert_frame_equal(res.metrics, pd.DataFrame(lines))
    assert res.summary == json.loads(res.summary_path.read_text())
    assert res.summary["final_accuracy"] == res.metrics["accuracy"].iloc[-1]
    assert res.config_toml == res.config.to_toml()
    assert res.config.run.rounds == 2 and res.config.run.threads == 1


def test_model_of_the_run_scores_the_logged_final_accuracy(demo_run):
    model = demo_run.model()
    assert not model.training
    assert demo_run.evaluate(model)["accuracy"] == demo_run.summary["final_accuracy"]


def test_load_run_round_trip(demo_run):
    back = mmfl.load_run(demo_run.run_dir)
    assert back.summary == demo_run.summary
    assert back.config.to_dict() == demo_run.config.to_dict()
    pd.testing.assert_frame_equal(back.metrics, demo_run.metrics)
    assert back.evaluate()["accuracy"] == demo_run.summary["final_accuracy"]
    assert back.client_accuracy is None  # a FedAvg run reports no per-client accuracy


def test_personalized_run_client_models_score_the_logged_client_accuracy(tmp_path):
    res = mmfl.run(DEMO, rounds=1, threads=1, output_dir=str(tmp_path), algorithm__name="fedfomo", progress=False)
    per = res.client_accuracy
    assert per.shape == (1, 10) and list(per.index) == [1]
    assert per.loc[1].tolist() == res.metrics["client_accuracy"].iloc[-1]
    for c in (0, 7):  # client c's own model on its personalized test rows: the logged number
        assert res.evaluate(client=c)["accuracy"] == per.loc[1, c]


def test_overrides_keywords_dict_and_cli_strings_agree():
    by_kw = mmfl.configure(DEMO, rounds=3, algorithm__name="fedprox", algorithm__mu=0.1, train__lr=0.05)
    by_dict = mmfl.configure(DEMO, set={"rounds": 3, "algorithm.name": "fedprox", "algorithm.mu": 0.1,
                                        "train.lr": 0.05})
    by_cli = mmfl.configure(DEMO, set=["rounds=3", "algorithm.name=fedprox", "algorithm.mu=0.1", "train.lr=0.05"])
    assert by_kw.to_dict() == by_dict.to_dict() == by_cli.to_dict()
    assert (by_kw.run.rounds, by_kw.algorithm.name, by_kw.algorithm.params.mu, by_kw.train.lr) == \
        (3, "fedprox", 0.1, 0.05)
    # set first, then the keywords
    assert mmfl.configure(DEMO, set={"rounds": 7}, rounds=4).run.rounds == 4


def test_config_as_dict_and_as_experiment_config_resolve_the_same():
    cfg = mmfl.configure(DEMO)
    from mmfl.config_raw import load_raw

    assert mmfl.configure(load_raw(DEMO)).to_dict() == cfg.to_dict()
    assert mmfl.configure(cfg, rounds=5).to_dict() == {**cfg.to_dict(), "rounds": 5}


def cli_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmfl: error: ") and "\n" not in err
    return err.removeprefix("mmfl: error: ")


@pytest.mark.parametrize("argv, call", [
    (["run", "nope.toml"], lambda: mmfl.run("nope.toml")),
    (["run", str(DEMO), "--set", "foo=1"], lambda: mmfl.run(DEMO, foo=1)),
    (["run", str(DEMO), "--set", "algorithm.muu=1"], lambda: mmfl.run(DEMO, algorithm__muu=1)),
    (["run", str(DEMO), "--set", "rounds=0"], lambda: mmfl.run(DEMO, set={"rounds": 0})),
])
def test_errors_are_the_cli_line(argv, call, capsys):
    line = cli_error(argv, capsys)
    with pytest.raises(ConfigError) as e:
        call()
    assert str(e.value) == line


def test_load_run_of_a_folder_that_is_no_run(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(MMFLError, match=r"not an mmfl run folder"):
        mmfl.load_run(tmp_path)
    with pytest.raises(MMFLError, match=r"no such run folder"):
        mmfl.load_run(tmp_path / "missing")


def test_override_into_a_value_that_is_not_a_table():
    with pytest.raises(ConfigError, match=r"^rounds__x: rounds is not a table$"):
        mmfl.configure(DEMO, rounds__x=1)


def test_list_gives_the_registered_names():
    algos = mmfl.list("algorithm")
    assert {"fedavg", "fedprox", "moon"} <= set(algos) and all(isinstance(h, str) for h in algos.values())
    with pytest.raises(ConfigError, match=r"^kind: must be one of"):
        mmfl.list("nope")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=patience(120))
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_import_mmfl_version_and_missing_config_import_no_torch():
    mods = _modules_after(
        "import mmfl, mmfl.cli, contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()) as o:\n"
        "    try: mmfl.cli.main(['--version'])\n"
        "    except SystemExit as e: assert e.code == 0\n"
        "assert o.getvalue().strip() == 'mmfl ' + mmfl.__version__, o.getvalue()\n"
        "with contextlib.redirect_stderr(io.StringIO()):\n"
        "    assert mmfl.cli.main(['run', 'nope.toml']) == 2\n"
        "    assert mmfl.cli.main(['partition', 'nope.toml']) == 2\n"
        "try: mmfl.run('nope.toml')\n"
        "except mmfl.api.MMFLError: pass\n")
    assert "mmfl.api" in mods
    assert not {m for m in mods if m.split(".")[0] in ("torch", "numpy", "pandas")}


def test_missing_files_of_other_commands_are_said_without_torch_or_flower():
    mods = _modules_after(
        "import contextlib, io, mmfl.cli\n"
        "with contextlib.redirect_stderr(io.StringIO()) as e:\n"
        "    for argv in (['flower', 'simulate', 'nope.toml'], ['vqa', 'nope', '--emoji'], ['bench', 'nope.toml']):\n"
        "        assert mmfl.cli.main(argv) == 2\n"
        "assert e.getvalue().count('mmfl: error: ') == 3, e.getvalue()\n")
    assert not {m.split(".")[0] for m in mods} & {"torch", "flwr"}


def test_list_imports_no_flower_transformers_sklearn_pandas():
    mods = _modules_after("import contextlib, io, mmfl.cli\n"
                          "with contextlib.redirect_stdout(io.StringIO()): mmfl.cli.main(['list'])\n")
    heavy = {"flwr", "transformers", "sklearn", "pandas", "matplotlib", "scipy", "datasets", "ray"}
    assert not {m.split(".")[0] for m in mods} & heavy


def test_docs_api_example_prints_what_the_page_shows(tmp_path, monkeypatch):
    """docs/api.md's notebook example, run in a scratch folder, prints the page's numbers."""
    page = (ROOT / "docs" / "api.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", page, re.S).group(1)
    (tmp_path / "mmfl").mkdir()
    shutil.copytree(DEMO.parent, tmp_path / "mmfl" / "configs")
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    buf = io.StringIO()
    with redirect_stdout(buf):
        exec(compile(code, "docs/api.md", "exec"), {})
    assert buf.getvalue() == shown
    assert (tmp_path / "api-demo.png").read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------------------- class names, partition

def test_class_names_and_partition_of_a_run_and_before_it(demo_run):
    fed = demo_run.federation()
    assert demo_run.class_names == [str(n) for n in fed.meta.class_names] and len(demo_run.class_names) == 10
    df = demo_run.partition()
    mods = list(fed.meta.modalities)  # mfeat's six views
    assert list(df.columns) == ["client", "label", "class", "count", *mods]
    assert len(df) == fed.num_clients * 10  # every client x class, zeros included
    per_client = df.groupby("client")["count"].sum()
    assert per_client.tolist() == [len(c) for c in fed.clients]
    assert all((df[m] == df["count"]).all() for m in mods)  # every client holds every view, no masks
    wide = demo_run.partition(wide=True)  # Flower Datasets' compute_counts shape
    assert wide.shape == (fed.num_clients, 10) and list(wide.columns) == demo_run.class_names
    assert wide.loc[3].tolist() == df[df["client"] == 3]["count"].tolist()
    before = mmfl.partition(DEMO, rounds=2, threads=1)  # the federation alone, no run
    pd.testing.assert_frame_equal(before, df)


def test_partition_counts_per_modality_follow_who_holds_it_and_the_per_sample_masks():
    from mmfl.data.federation import build_federation

    over = {"data": {"name": "mfeat", "views": ["pix", "fou"]}, "partition": {"num_clients": 4},
            "modalities": {"name": "explicit", "holds": [["pix", "fou"], ["pix", "fou"], ["pix"], ["fou"]],
                           "missing_rate": {"pix": 0.3}},
            "model": {"name": "multimodal"}, "algorithm": {"name": "mfedavg"}}
    df = mmfl.partition(DEMO, **over)
    fed = build_federation(mmfl.configure(DEMO, **over))
    assert list(df.columns) == ["client", "label", "class", "count", "pix", "fou"]
    by = df.groupby("client")[["count", "pix", "fou"]].sum()
    for cid in range(4):
        data, holds = fed.clients[cid], fed.modalities_of(cid)
        mask = data.features.get("present/pix")
        want_pix = 0 if "pix" not in holds else (len(data) if mask is None else int(mask[data.indices].sum()
                                                                                    if data.indices is not None
                                                                                    else mask.sum()))
        assert by.loc[cid, "count"] == len(data)
        assert by.loc[cid, "pix"] == want_pix and by.loc[cid, "fou"] == (len(data) if "fou" in holds else 0)
    assert by.loc[0, "pix"] < by.loc[0, "count"]  # a multimodal client lacks pix on ~30% of its rows
    assert (df["pix"] <= df["count"]).all()
