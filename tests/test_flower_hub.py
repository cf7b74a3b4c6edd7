"""``mmfl flower new``: an mmfl experiment as a stand-alone Flower app (Flower Hub layout) that
plain ``flwr build`` bundles and plain ``flwr run DIR`` runs, with no mmfl command in between."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import patience

pytest.importorskip("flwr")

from mmfl.cli import main as cli_main  # noqa: E402
from mmfl.config import load_config  # noqa: E402
from mmfl.flower.client_app import CONFIG_KEY, SET_KEY, run_config_text  # noqa: E402
from mmfl.flower.deploy import BIN, LocalDeployment, flower_env, run_app  # noqa: E402
from mmfl.flower.hub import write_app  # noqa: E402
from mmfl.flower.simulation import federation_config  # noqa: E402

try:
    from test_flower import BASE, assert_same_run, simulator_run
except ImportError:  # run as the package tests.*
    from tests.test_flower import BASE, assert_same_run, simulator_run


@pytest.mark.flwr_range
def test_new_writes_a_flower_app_that_flwr_build_bundles(tmp_path, capsys):
    argv = ["flower", "new", str(tmp_path / "mfeat-fedavg"), str(Path(__file__).with_name("flower_tiny.toml")),
            "--publisher", "someone", *[x for o in BASE for x in ("--set", o)]]
    assert cli_main(argv) == 0, capsys.readouterr().err
    app = tmp_path / "mfeat-fedavg"
    doc = tomllib.loads((app / "pyproject.toml").read_text())
    flwr = doc["tool"]["flwr"]["app"]
    assert flwr["publisher"] == "someone" and doc["project"]["name"] == "mfeat-fedavg"
    assert flwr["components"] == {"serverapp": "mfeat_fedavg.server_app:app", "clientapp": "mfeat_fedavg.client_app:app"}
    assert any(d.startswith("mmfl[flower]") for d in doc["project"]["dependencies"])
    cfg = load_config(Path(__file__).with_name("flower_tiny.toml"), BASE)
    assert flwr["config"][CONFIG_KEY] == cfg.to_toml() and flwr["config"][SET_KEY] == ""
    assert (app / "README.md").is_file()
    # Flower's own bundler accepts it (it checks the pyproject and the components' modules)
    out = subprocess.run([str(BIN / "flwr"), "build", "--app", str(app)], cwd=tmp_path, env=flower_env(tmp_path / "home"),
                         capture_output=True, text=True, timeout=patience(120))
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(tmp_path.glob("*.fab"))


def test_new_refuses_a_used_folder_and_a_bad_name_in_one_line(tmp_path, capsys):
    cfg = str(Path(__file__).with_name("flower_tiny.toml"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.md").write_text("mine")
    assert cli_main(["flower", "new", str(tmp_path / "taken"), cfg]) == 2
    assert (tmp_path / "taken" / "notes.md").read_text() == "mine"  # untouched
    assert cli_main(["flower", "new", str(tmp_path / "1st_app"), cfg]) == 2
    assert not (tmp_path / "1st_app").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("mmfl: error: flower new: ") for e in err)
    assert "not an empty folder" in err[0] and "app name" in err[1]


def test_mmfl_set_overrides_the_app_config_for_one_run(tmp_path):
    cfg = load_config(None, [*BASE, f"output_dir={tmp_path}"])
    text = run_config_text({CONFIG_KEY: cfg.to_toml(), SET_KEY: 'rounds=5 name="other run"'})
    again = load_config(None, [*BASE, f"output_dir={tmp_path}", "rounds=5", 'name="other run"'])
    assert text == again.to_toml()
    assert run_config_text({CONFIG_KEY: cfg.to_toml(), SET_KEY: ""}) == cfg.to_toml()


@pytest.mark.slow
def test_plain_flwr_run_of_the_app_equals_the_simulator(tmp_path):
    """`flwr run DIR` on a simulation SuperLink, with only `mmfl-set` on the command line: the
    same metrics and final model as the in-process simulator with those values."""
    over = [f"output_dir={tmp_path / 'flower'}", "name=hub", "partition.num_clients=3"]
    app = write_app(load_config(Path(__file__).with_name("flower_tiny.toml"), [*BASE, *over]), tmp_path / "hub-app")
    fed = federation_config(3, 1, 0.0, 2, 0, False)
    with LocalDeployment(0, tmp_path / "link", simulation=True,
                         env={"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}) as link:
        run_id = run_app(app, "loopback", link.home, ["--run-config", f'{SET_KEY}="seed=7"'], fed)
        done = tmp_path / "flower" / "hub" / "summary.json"
        status = link.wait(run_id, timeout=patience(300), done_file=done)
        assert status == "finished:completed", link.run_log(run_id)[-3000:]
    assert_same_run(tmp_path / "flower" / "hub", simulator_run(tmp_path, "hub", "seed=7", "partition.num_clients=3"))
