"""Submitting runs to a Flower deployment, and a loopback deployment on 127.0.0.1.

:func:`submit` is ``flwr run`` of mmfl's Flower app (:data:`APP_DIR`) with the
mmfl config in the run config. :class:`LocalDeployment` starts a SuperLink and
SuperNodes as real processes on this machine (insecure: loopback only); the
tests and the benchmark use it, and so does ``mmfl flower loopback``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from mmfl.schema import ExperimentConfig
from mmfl.errors import MMFLError
from mmfl.flower.client_app import CONFIG_KEY
from mmfl.flower.node_state import NODE_KEY
from mmfl.flower.server_app import OVERWRITE_KEY, RESUME_KEY

APP_DIR = Path(__file__).resolve().parent / "app"
BIN = Path(sys.executable).parent  # flwr, flower-superlink, flower-supernode live beside python


def flower_env(flwr_home: str | Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")  # start a ClientApp/ServerApp task sooner (default 1s)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # the processes import the mmfl this process runs (a source checkout ahead of an installed one)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_run_config(cfg: ExperimentConfig, path: Path, overwrite: bool = False, resume: bool = False) -> Path:
    """The ``--run-config`` file of ``flwr run``: the resolved mmfl config as text."""
    run_config = {CONFIG_KEY: cfg.to_toml(), OVERWRITE_KEY: bool(overwrite)}
    if resume:
        run_config[RESUME_KEY] = True
    path.write_text(tomli_w.dumps(run_config))
    return path


def write_connection(flwr_home: Path, name: str, address: str, insecure: bool,
                     root_certificates: str | None = None) -> None:
    """A Flower configuration (``$FLWR_HOME/config.toml``) with one SuperLink connection."""
    conn: dict = {"address": address}
    if insecure:
        conn["insecure"] = True
    elif root_certificates:
        conn["root-certificates"] = str(Path(root_certificates).resolve())
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}))


def _flwr(args: list[str], env: dict, timeout: float = 120) -> str:
    proc = subprocess.run([str(BIN / "flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-5:]
        raise MMFLError(f"flwr {args[0]} failed: {' '.join(tail)}")
    return proc.stdout


def submit(cfg: ExperimentConfig, connection: str, flwr_home: Path, overwrite: bool = False,
           resume: bool = False, federation_config: list[str] | None = None) -> int:
    """Start ``cfg`` on the SuperLink of ``connection``; the Flower run id. ``resume``: the
    ServerApp continues the run folder from its last intact checkpoint. ``federation_config``:
    ``flwr run --federation-config`` entries (a simulation SuperLink's ``num-supernodes=4``, ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        rc = write_run_config(cfg, Path(tmp) / "run_config.toml", overwrite, resume)
        return run_app(APP_DIR, connection, flwr_home, ["--run-config", str(rc)], federation_config)


def run_app(app_dir: Path, connection: str, flwr_home: Path, run_config: list[str] | None = None,
            federation_config: list[str] | None = None) -> int:
    """``flwr run APP_DIR CONNECTION [--run-config ...]``: the Flower run id. ``app_dir`` is
    mmfl's app, or one that ``mmfl flower new`` wrote (its run config is in its pyproject)."""
    env = flower_env(flwr_home)
    extra = ["--federation-config", " ".join(federation_config)] if federation_config else []
    out = _flwr(["run", str(app_dir), connection, *(run_config or []), *extra, "--format", "json"], env)
    try:
        res = json.loads(out[out.index("{"):])
    except ValueError:
        raise MMFLError(f"flwr run: unexpected output {out.strip()[-300:]!r}") from None
    if not res.get("success") or res.get("run-id") is None:
        why = " ".join(str(res.get("error-message", res)).split())
        raise MMFLError(f"flwr run failed: {why}")
    return int(res["run-id"])


def run_status(run_id: int, connection: str, flwr_home: Path) -> str:
    """The status of run ``run_id`` as ``flwr ls --run-id N --format json`` (Flower's public CLI)
    shows it: ``finished:completed``, ``running``, ...; no such run, or no answer, raises
    :class:`MMFLError` with Flower's reason (``Run ID not found``, ...)."""
    env = flower_env(flwr_home)
    cmd = [str(BIN / "flwr"), "ls", connection, "--run-id", str(run_id), "--format", "json"]
    why = ""
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        out = proc.stdout
        res = json.loads(out[out.index("{"):]) if "{" in out else {}
        if proc.returncode != 0 or not res.get("success", False):
            why = str(res.get("error-message", "") or proc.stderr.strip()[-300:] or out.strip()[-300:])
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        why = str(e)
    if why:
        raise MMFLError(f"cannot get the status of run {run_id} from SuperLink {connection!r}: {' '.join(why.split())}")
    runs = res.get("runs", [])
    return str(runs[0].get("status", "unknown")) if runs else "unknown"


def run_log(run_id: int, connection: str, flwr_home: Path) -> str:
    try:
        return _flwr(["log", str(run_id), connection, "--show"], flower_env(flwr_home), timeout=60)
    except (MMFLError, subprocess.TimeoutExpired) as e:
        return f"(no log: {e})"


def wait(run_id: int, connection: str, flwr_home: Path, timeout: float = 24 * 3600, poll: float = 2.0,
         done_file: Path | None = None, max_poll: float = 15.0) -> str:
    """Block until the run finishes; its final status (``finished:completed`` on success).

    Each ask is a ``flwr ls`` process (:func:`run_status`, about a CPU second), so the
    SuperLink is asked after ``poll`` seconds, then at intervals growing by half up to
    ``max_poll``. With ``done_file`` (the run's summary.json, when the SuperLink writes to
    this machine) it is asked as soon as that file is written (appears, or changes on a
    resume), then every ``poll`` seconds: a finished run is seen a moment after its last
    file, a failed one (no summary) within ``max_poll``.
    """
    def stamp():
        try:
            return done_file.stat().st_mtime_ns
        except OSError:
            return None

    start = time.monotonic()
    deadline, next_ask, interval = start + timeout, start + poll, poll
    before = stamp() if done_file is not None else None
    done = False
    while time.monotonic() < deadline:
        if done_file is not None and not done and stamp() not in (None, before):
            done, next_ask, interval = True, time.monotonic(), poll
        if time.monotonic() >= next_ask:
            status = run_status(run_id, connection, flwr_home)
            if status.startswith("finished"):
                return status
            if not done:
                interval = min(max_poll, interval * 1.5)
            next_ask = time.monotonic() + interval
        time.sleep(0.2)
    raise MMFLError(f"run {run_id} did not finish within {timeout:.0f}s")


class LocalDeployment:
    """A SuperLink and ``num_supernodes`` SuperNodes on 127.0.0.1 (insecure), as
    real processes in their own process groups; :meth:`stop` ends them all.
    ``state_dir``: the SuperNodes keep their clients' state there (node config
    ``state-dir``), so a run can be resumed, also by another deployment. ``simulation``: the
    SuperLink runs its runs on Flower's simulation engine (``flower-superlink --simulation``;
    no SuperNode processes: give ``num_supernodes=0`` and ``flwr run --federation-config``)."""

    def __init__(self, num_supernodes: int, workdir: Path, num_partitions: int | None = None,
                 node_configs: list[str] | None = None, state_dir: str | Path | None = None,
                 simulation: bool = False, env: dict[str, str] | None = None):
        self.workdir = Path(workdir).resolve()
        self.home = self.workdir / "flwr_home"
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.simulation = simulation
        self.env = {**flower_env(self.home), **(env or {})}
        p = num_partitions or num_supernodes
        self.node_configs = node_configs or [f"partition-id={k} num-partitions={p}" for k in range(num_supernodes)]
        if state_dir is not None:
            where = json.dumps(str(Path(state_dir).resolve()))
            self.node_configs = [f"{nc} {NODE_KEY}={where}" for nc in self.node_configs]
        write_connection(self.home, "loopback", f"127.0.0.1:{self.port}", insecure=True)

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def start(self) -> "LocalDeployment":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start("superlink", [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1",
                                  "--port", str(self.port), "--disable-runtime-dependency-installation",
                                  *(["--simulation"] if self.simulation else [])])
        self._wait_port(self.port, "superlink")
        for k, nc in enumerate(self.node_configs):
            self.start_node(k, nc)
        return self

    def start_node(self, k: int, node_config: str) -> None:
        self._start(f"supernode{k}", [str(BIN / "flower-supernode"), "--insecure",
                                      "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()),
                                      "--node-config", node_config])

    def _wait_port(self, port: int, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise MMFLError(f"{name} exited: {self.log(name)[-500:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise MMFLError(f"{name} did not open port {port} within {timeout:.0f}s")

    def log(self, name: str) -> str:
        p = self.workdir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def submit(self, cfg: ExperimentConfig, overwrite: bool = False, resume: bool = False,
               federation_config: list[str] | None = None) -> int:
        return submit(cfg, "loopback", self.home, overwrite, resume, federation_config)

    def wait(self, run_id: int, timeout: float = 24 * 3600, poll: float = 2.0, done_file: Path | None = None) -> str:
        return wait(run_id, "loopback", self.home, timeout, poll, done_file)

    def run_log(self, run_id: int) -> str:
        return run_log(run_id, "loopback", self.home)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process and its children: SIGKILL is a crash, SIGTERM a shutdown."""
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):  # terminate politely: nodes first, then the link
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
            except (ProcessLookupError, PermissionError):
                pass

    def __enter__(self) -> "LocalDeployment":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
