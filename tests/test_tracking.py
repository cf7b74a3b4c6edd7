"""[tracking]: TensorBoard, MLflow and W&B (offline) fed from the metrics rows; each back-end's real
library writes real files, read back here and compared with metrics.jsonl (mmfl.engine.tracking)."""

import json
import os
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from mmfl.cli import demo_config_path, main
from mmfl.engine import tracking as tracking_mod
from mmfl.engine.runner import Experiment
from mmfl.engine.tracking import scalars
from mmfl.errors import ConfigError

import helpers
from helpers import rows, run_config

pytest.importorskip("tensorboard", reason="the tracking extra is not installed: pip install 'mmfl[tracking]'")
pytest.importorskip("mlflow", reason="the tracking extra is not installed: pip install 'mmfl[tracking]'")
pytest.importorskip("wandb", reason="the tracking extra is not installed: pip install 'mmfl[tracking]'")

TIMES = ("train_time_s", "wall_time_s")


def config(out: Path, name: str, *over: str, rounds: int = 2, backends=None):
    """The demo config on one thread, one local epoch; ``backends``: the tracking back-ends."""
    tail = [f"tracking.backends={json.dumps(backends)}"] if backends is not None else []
    return helpers.config(out, name, *over, *tail, base=("threads=1", "train.local_epochs=1"), rounds=rounds,
                          path=demo_config_path())


def run(out: Path, name: str, *over: str, resume: bool = False, **kw):
    return run_config(config(out, name, *over, **kw), resume=resume, overwrite=not resume)


def expected(run_dir: Path) -> dict[str, dict[int, float]]:
    """key -> {round: value} of every numeric key of metrics.jsonl (what each back-end must hold)."""
    out: dict = {}
    for row in rows(run_dir):
        for k, v in scalars(row).items():
            out.setdefault(k, {})[row["round"]] = v
    return out


def wandb_core_children() -> list[str]:
    ps = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "cmd="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if "wandb-core" in line]


def wandb_records(path: Path):
    """The records of an offline run's ``.wandb`` file (a LevelDB-style log: a 7-byte header, then
    32 KiB blocks of chunks ``crc32 u32, length u16, type u8`` whose data are protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def wandb_history(run_dir: Path) -> tuple[list[dict], dict, dict]:
    """(history rows, summary, config) of every offline run folder under <run>/wandb, in order."""
    history, summary, cfg = [], {}, {}
    for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
            elif kind == "summary":
                summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update})
            elif kind == "run":
                cfg = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
    return history, summary, cfg


def tb_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One 2-round demo run with all three back-ends, and the same run without tracking."""
    out = tmp_path_factory.mktemp("tracking")
    lookups = []
    real = socket.getaddrinfo
    socket.getaddrinfo = lambda *a, **k: lookups.append(a[:2]) or real(*a, **k)
    try:
        exp = run(out, "all", backends=["tensorboard", "mlflow", "wandb"])
    finally:
        socket.getaddrinfo = real
    plain = run(out, "plain")
    return exp, plain, lookups


def test_scalars_flatten_tables_and_leave_out_per_client_maps_and_the_step():
    row = {"round": 3, "accuracy": 0.5, "flag": True, "dropped": [1], "bytes_by_route": {"train": {"up": 7}},
           "bytes_per_client": {"0": {"up": 1}, "1": {"up": 2}}, "attack/kind": "scale"}
    assert scalars(row) == {"accuracy": 0.5, "flag": 1.0, "bytes_by_route/train/up": 7.0}


def test_tracking_does_not_change_the_results(tracked):
    exp, plain, _ = tracked
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMES} for r in rows]  # noqa: E731
    assert strip(rows(exp.run_dir)) == strip(rows(plain.run_dir))
    assert not (plain.run_dir / "tb").exists() and not (plain.run_dir / "tracking.json").exists()


def test_tensorboard_scalars_equal_metrics_jsonl(tracked):
    exp = tracked[0]
    got = tb_scalars(exp.run_dir / "tb")
    want = expected(exp.run_dir)
    assert "accuracy" in want and "bytes_by_route/train/up" in want
    for key, by_round in want.items():
        assert [s for s, _ in got[key]] == sorted(by_round), key  # one point per round, step = round
        assert [v for _, v in got[key]] == pytest.approx([by_round[s] for s in sorted(by_round)], rel=1e-6), key
    summary = json.loads((exp.run_dir / "summary.json").read_text())
    assert got["summary/final_accuracy"] == [(2, pytest.approx(summary["final_accuracy"], rel=1e-6))]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp.run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    assert {"config/text_summary", "summary/text_summary"} <= set(acc.Tags()["tensors"])
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert 'name = "fedavg"' in text and "rounds = 2" in text


def test_mlflow_history_params_and_artifacts_equal_the_run(tracked):
    from mlflow.tracking import MlflowClient

    exp = tracked[0]
    run_id = json.loads((exp.run_dir / "tracking.json").read_text())[
        f"mlflow:{(exp.run_dir / 'mlruns').resolve()}"]["run_id"]
    client = MlflowClient(tracking_uri=(exp.run_dir / "mlruns").resolve().as_uri())
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "all"
    for key, by_round in expected(exp.run_dir).items():
        hist = client.get_metric_history(run_id, key)
        assert sorted((m.step, m.value) for m in hist) == sorted(by_round.items()), key
    assert run.data.params["algorithm.name"] == "fedavg" and run.data.params["rounds"] == "2"
    assert run.data.params["partition.num_clients"] == "10"
    art = Path(run.info.artifact_uri.removeprefix("file://"))
    assert json.loads((art / "summary.json").read_text()) == json.loads((exp.run_dir / "summary.json").read_text())
    assert (art / "config.toml").read_text() == (exp.run_dir / "config.toml").read_text()


def test_wandb_offline_history_summary_config_and_no_network(tracked):
    exp, _, lookups = tracked
    history, summary, cfg = wandb_history(exp.run_dir)
    assert [h["round"] for h in history] == [1, 2] and [h["_step"] for h in history] == [1, 2]
    for key, by_round in expected(exp.run_dir).items():
        assert [h[key] for h in history] == pytest.approx([by_round[1], by_round[2]]), key
    want = json.loads((exp.run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == want["final_accuracy"] and summary["algorithm"] == "fedavg"
    assert cfg["algorithm"]["name"] == "fedavg" and cfg["rounds"] == 2
    assert lookups == []  # no host name was looked up: nothing tried the network
    assert wandb_core_children() == []  # the wandb-core service was shut down
    assert "WANDB_MODE" not in os.environ and "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # restored


def test_resume_logs_each_round_once_and_backfills_a_backend_added_on_resume(tmp_path):
    from mlflow.tracking import MlflowClient

    run(tmp_path, "r", rounds=1, backends=["tensorboard"])
    exp = run(tmp_path, "r", rounds=3, backends=["tensorboard", "mlflow"], resume=True)  # table changed: allowed
    want = expected(exp.run_dir)["accuracy"]
    assert [s for s, _ in tb_scalars(exp.run_dir / "tb")["accuracy"]] == [1, 2, 3]
    state = json.loads((exp.run_dir / "tracking.json").read_text())
    run_id = state[f"mlflow:{(exp.run_dir / 'mlruns').resolve()}"]["run_id"]
    client = MlflowClient(tracking_uri=(exp.run_dir / "mlruns").resolve().as_uri())
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "accuracy")) == sorted(want.items())


def test_a_failed_run_closes_its_trackers_and_its_resume_logs_no_round_twice(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    real = Experiment._checkpoint

    def crash_in_round_2(self, rnd):  # round 2's row is written and tracked, its checkpoint is not
        if rnd == 1:
            raise RuntimeError("disk gone")
        real(self, rnd)

    backends = ["tensorboard", "mlflow", "wandb"]
    monkeypatch.setattr(Experiment, "_checkpoint", crash_in_round_2)
    with pytest.raises(RuntimeError):
        run(tmp_path, "c", backends=backends)
    d = tmp_path / "c"
    key = f"mlflow:{(d / 'mlruns').resolve()}"
    client = MlflowClient(tracking_uri=(d / "mlruns").resolve().as_uri())
    run_id = json.loads((d / "tracking.json").read_text())[key]["run_id"]
    assert client.get_run(run_id).info.status == "FAILED"
    assert wandb_core_children() == []
    monkeypatch.setattr(Experiment, "_checkpoint", real)
    exp = run(tmp_path, "c", backends=backends, resume=True)  # round 2 runs again
    assert [r["round"] for r in rows(d)] == [1, 2]
    assert [s for s, _ in tb_scalars(d / "tb")["accuracy"]] == [1, 2]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run_id, "accuracy")) == [1, 2]
    history, _, _ = wandb_history(exp.run_dir)
    assert [h["round"] for h in history] == [1, 2]


def test_bad_tracking_values_and_a_missing_library_are_one_line_errors(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="tracking.backends: unknown back-end 'tensorbord'"):
        config(tmp_path, "x", backends=["tensorbord"])
    with pytest.raises(ConfigError, match="tracking.dirr: unknown key"):
        config(tmp_path, "x", "tracking.dirr=1")
    assert config(tmp_path, "x", "tracking.backends=mlflow").tracking.backends == ["mlflow"]
    find = tracking_mod.importlib.util.find_spec
    monkeypatch.setattr(tracking_mod.importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else find(n, *a))
    code = main(["run", str(demo_config_path()), "--set", f"output_dir={json.dumps(str(tmp_path))}",
                 "--track", "wandb", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "mmfl: error: tracking.backends: 'wandb' needs the wandb package: pip install 'mmfl[tracking]'"]
    assert not (tmp_path / "demo").exists()  # refused before the run folder was made


def test_flower_server_app_tracks_the_same_rows(tmp_path):
    pytest.importorskip("flwr", reason='Flower not installed (pip install -e ".[flower]")')
    try:
        from test_flower import BASE, InProcessGrid
    except ImportError:  # run as the package tests.*
        from tests.test_flower import BASE, InProcessGrid
    from mmfl.flower.server_app import run_server

    cfg = helpers.config(tmp_path, "fl", 'tracking.backends=["tensorboard"]', base=BASE, rounds=None)
    text = cfg.to_toml()
    nodes = {11: {"partition-id": 0, "num-partitions": 2}, 22: {"partition-id": 1, "num-partitions": 2}}
    run_server(InProcessGrid(text, nodes), text, wait_for_nodes_s=0, announce=False)
    got = tb_scalars(cfg.run_dir / "tb")
    for key, by_round in expected(cfg.run_dir).items():
        assert got[key] == [(s, pytest.approx(v, rel=1e-6)) for s, v in sorted(by_round.items())], key
