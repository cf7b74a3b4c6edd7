"""Experiment tracking (``[tracking]``, :class:`mmfl.schema.TrackingConfig`; docs/tracking.md):
TensorBoard, MLflow and W&B, all offline, fed by the runner with the same dict rows it writes to
``metrics.jsonl`` (step = round), plus the resolved config and the final summary.

Each back-end's library is imported only when a run uses it; a missing one is a one-line
:class:`~mmfl.errors.ConfigError` before the run starts (:func:`check_installed`).

Resume: ``<run>/tracking.json`` keeps, per back-end and location, the last round it logged (and
the MLflow run id / W&B run id). A resumed run first logs the rows of ``metrics.jsonl`` a back-end
lacks (a back-end added on resume gets the earlier rounds), then continues; no round is logged twice
(a round re-run after a crash between its row and its checkpoint keeps its first values there, which
a resumed run reproduces). A back-end that fails while logging prints one warning line and is off for
the rest of the run; the run's results never depend on tracking.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import time
import uuid
from pathlib import Path

from mmfl.engine import runfiles
from mmfl.errors import ConfigError, MMFLError

INSTALL = "pip install 'mmfl[tracking]'"
STATE_FILE = "tracking.json"
_MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def check_installed(tracking) -> None:
    """ConfigError naming the pip extra when a configured back-end's library is missing."""
    if tracking is None:
        return
    for b in tracking.backends:
        if importlib.util.find_spec(_MODULES[b]) is None:
            raise ConfigError(f"tracking.backends: {b!r} needs the {_MODULES[b]} package: {INSTALL}")


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The numeric values of a metrics row, nested tables flattened with ``/``
    (``bytes_by_route/train/up``); ``round`` (the step), lists and per-client tables
    (keys all client ids, e.g. ``bytes_per_client``) are left out."""
    out = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)):
            if key != "round":
                out[key] = float(v)
        elif isinstance(v, dict) and v and not all(str(c).isdigit() for c in v):
            out.update(scalars(v, key + "/"))
    return out


_MLFLOW_BAD = re.compile(r"[^\w.\- /]")


def mlflow_names(keys, names: dict[str, str]) -> dict[str, str]:
    """The MLflow metric name of each key of ``keys`` (a :func:`scalars` key); ``names``, the names
    given so far (key -> name, kept in tracking.json), gets the new keys' names.

    MLflow's file store writes a metric ``a/b`` as the file ``metrics/a/b``, so a metric that is a
    path prefix of another (``accuracy`` and ``accuracy/pix``) cannot be stored (the MLflow run used
    to fail at round 1 of every multimodal run). The rule: a ``/`` right after a part that is itself
    a metric becomes ``.`` (``accuracy/pix`` -> ``accuracy.pix``, ``personal/accuracy/pix`` ->
    ``personal/accuracy.pix`` where ``personal/accuracy`` is a metric); every other ``/`` stays
    (``bytes_by_route/train/up``, ``pattern/complete/accuracy``: MLflow's UI groups by it).
    Characters MLflow refuses become ``_``. A key keeps its first name for the rest of the run
    (resume included); a name that would still collide with one given before (a metric that
    appears after its sub-metrics did) gets ``/`` -> ``.`` throughout, then ``_`` appended."""
    new = [k for k in keys if k not in names]
    if new:
        leaves = set(names) | set(keys)
        used = set(names.values())
        for k in new:
            parts = [_MLFLOW_BAD.sub("_", p) or "_" for p in k.split("/")]
            name = parts[0]
            for i in range(1, len(parts)):
                name += ("." if "/".join(k.split("/")[:i]) in leaves else "/") + parts[i]
            if _collides(name, used):
                name = ".".join(parts)
                while _collides(name, used):
                    name += "_"
            names[k] = name
            used.add(name)
    return {k: names[k] for k in keys}


def _collides(name: str, used: set[str]) -> bool:
    """``name`` equals a used name, or one of them is a folder of the other in a file store."""
    return name in used or any(u.startswith(name + "/") or name.startswith(u + "/") for u in used)


def flat_config(d: dict, prefix: str = "") -> dict[str, str | int | float | bool]:
    """A config dict flattened to ``table.key`` -> value; lists and tables of lists as JSON text."""
    out: dict = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_config(v, key + "."))
        elif isinstance(v, (str, int, float, bool)):
            out[key] = v
        else:
            out[key] = json.dumps(v)
    return out


class _Backend:
    name = ""
    ENV: dict[str, str] = {}  # set while the back-end is open (before its library is imported), then restored

    def __init__(self, cfg, run_dir: Path, state: dict):
        self.cfg, self.run_dir, self.state = cfg, run_dir, state  # state: this back-end's entry
        t = cfg.tracking
        self.base = Path(t.dir) if t.dir else run_dir
        self.run_name = t.run_name or cfg.run.name

    @property
    def last(self) -> int:
        return int(self.state.get("last", 0))

    def set_env(self) -> None:
        self._saved_env = {k: os.environ.get(k) for k in self.ENV}
        os.environ.update(self.ENV)

    def restore_env(self) -> None:
        for k, v in getattr(self, "_saved_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def open(self, config_toml: str) -> None: ...
    def log(self, row: dict, step: int) -> None: ...
    def finish(self, summary: dict, step: int) -> None: ...
    def close(self, failed: bool) -> None: ...


class TensorBoard(_Backend):
    """Event files in ``<run>/tb`` (or ``<dir>/tb/<run_name>``): one scalar per numeric key per
    round, the config (text), and at the end the summary (text, and hparams: the flattened config
    with ``summary/*`` metrics for TensorBoard's HParams tab)."""

    name = "tensorboard"

    def location(self) -> Path:
        return self.run_dir / "tb" if not self.cfg.tracking.dir else self.base / "tb" / self.run_name

    def open(self, config_toml):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides events at steps >= it from older files in this folder
        # (a run replaced by --overwrite, or rounds logged before a crash and re-run)
        self.writer = SummaryWriter(str(self.location()), purge_step=self.last + 1)
        self.writer.add_text("config", "```toml\n" + config_toml + "\n```", self.last)
        self.writer.flush()

    def log(self, row, step):
        for k, v in scalars(row).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def finish(self, summary, step):
        self.writer.add_text("summary", "```json\n" + json.dumps(summary, indent=2) + "\n```", step)
        metrics = {f"summary/{k}": v for k, v in scalars(summary).items() if k != "rounds" and math.isfinite(v)}
        self.writer.add_hparams(flat_config(self.cfg.to_dict()), metrics, run_name=".", global_step=step)
        self.writer.flush()

    def close(self, failed):
        self.writer.close()


class MLflow(_Backend):
    """A local file store ``<run>/mlruns`` (or ``<dir>/mlruns``), experiment ``project``: the
    flattened config as params, each numeric key as a metric per round, config.toml and
    summary.json as artifacts, the summary's numbers as ``summary/*`` metrics."""

    name = "mlflow"
    # mlflow 3 keeps the file store in maintenance mode and refuses it unless allowed; it is the
    # store that needs no database and no server. Its usage telemetry would go to the network.
    ENV = {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}

    def location(self) -> Path:
        return self.base / "mlruns"

    def open(self, config_toml):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.location().mkdir(parents=True, exist_ok=True)
        self.client = c = MlflowClient(tracking_uri=self.location().resolve().as_uri())
        run_id = self.state.get("run_id")
        if run_id is not None:
            try:
                run = c.get_run(run_id)
            except Exception:  # the store was moved or deleted: a new MLflow run
                run_id, self.state["last"] = None, 0
                self.state.pop("names", None)
            else:
                c.update_run(run_id, status="RUNNING")
        if run_id is None:
            exp = c.get_experiment_by_name(self.cfg.tracking.project)
            if exp is None:
                try:
                    eid = c.create_experiment(self.cfg.tracking.project)
                except Exception:  # created meanwhile by a parallel run sharing the store
                    eid = c.get_experiment_by_name(self.cfg.tracking.project).experiment_id
            else:
                eid = exp.experiment_id
            run = c.create_run(eid, run_name=self.run_name, tags={"mmfl.run_dir": str(self.run_dir.resolve())})
            run_id = self.state["run_id"] = run.info.run_id
        self.run_id = run_id
        have = dict(run.data.params)
        # params are immutable in MLflow: a resumed run logs only those it lacks ('rounds' keeps its first value)
        flat = {_MLFLOW_BAD.sub("_", k): v for k, v in flat_config(self.cfg.to_dict()).items()}
        params = [Param(k, str(v)[:6000]) for k, v in flat.items() if k not in have]
        for i in range(0, len(params), 100):
            c.log_batch(run_id, params=params[i:i + 100])
        c.log_text(run_id, config_toml, "config.toml")

    def log(self, row, step):
        ts = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=self.metrics(scalars(row), ts, step))

    def metrics(self, values: dict[str, float], ts: int, step: int) -> list:
        """``values`` as MLflow metrics under their :func:`mlflow_names` (kept in tracking.json)."""
        from mlflow.entities import Metric

        names = mlflow_names(values, self.state.setdefault("names", {}))
        return [Metric(names[k], v, ts, step) for k, v in values.items()]

    def finish(self, summary, step):
        ts = int(time.time() * 1000)
        values = {f"summary/{k}": v for k, v in scalars(summary).items()}
        self.client.log_batch(self.run_id, metrics=self.metrics(values, ts, step))
        self.client.log_dict(self.run_id, summary, "summary.json")

    def close(self, failed):
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class WandB(_Backend):
    """An offline W&B run in ``<run>/wandb/offline-run-*`` (or ``<dir>/wandb/``): the config,
    each numeric key per round (W&B step = round), the summary. Offline only: WANDB_MODE=offline
    and no error reporting while the run is open (no network), console capture off; the wandb-core
    service is shut down at the end. A resumed run is a new offline folder with the same run id
    (``wandb sync`` uploads them into one run; the steps do not overlap)."""

    name = "wandb"
    ENV = {"WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true"}

    def location(self) -> Path:
        return self.base / "wandb"

    def open(self, config_toml):
        import wandb

        self.base.mkdir(parents=True, exist_ok=True)
        run_id = self.state.get("id") or uuid.uuid4().hex[:8]
        self.state["id"] = run_id
        settings = wandb.Settings(mode="offline", console="off", silent=True, x_disable_stats=True,
                                  x_disable_meta=True, save_code=False, disable_git=True, disable_job_creation=True)
        self.run = wandb.init(project=self.cfg.tracking.project, name=self.run_name, id=run_id, dir=str(self.base),
                              config=self.cfg.to_dict(), resume="allow" if self.last else None,
                              reinit="create_new", settings=settings)

    def log(self, row, step):
        self.run.log({**scalars(row), "round": step}, step=step)

    def finish(self, summary, step):
        self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))})

    def close(self, failed):
        import wandb

        self.run.finish(exit_code=1 if failed else 0)
        if wandb.run is None:  # no other W&B run in this process: stop the wandb-core service
            wandb.teardown()


BACKENDS = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": WandB}


class Tracking:
    """The run's back-ends. ``open`` (after the run folder is prepared), ``log`` each metrics row
    (after it is in metrics.jsonl, before its checkpoint), ``finish`` with the summary, ``close``
    (always; ``failed`` marks the tracked run as failed)."""

    def __init__(self, cfg, run_dir: Path, start: int, rows: list[dict]):
        """``start``: rounds completed (0: a new run); ``rows``: metrics.jsonl's rows so far."""
        self.run_dir = Path(run_dir)
        self.state = _load_state(self.run_dir / STATE_FILE)
        self.backends: list[_Backend] = []
        self.closed = False
        config_toml = cfg.to_toml()
        try:
            for name in cfg.tracking.backends:
                cls = BACKENDS[name]
                probe = cls(cfg, self.run_dir, {})
                key = f"{name}:{probe.location().resolve()}"
                entry = self.state.setdefault(key, {})
                if start == 0:
                    entry.clear()  # a new run (or --overwrite): nothing logged yet
                b = cls(cfg, self.run_dir, entry)
                b.set_env()
                self.backends.append(b)  # closed (and its environment restored) whatever happens next
                try:
                    b.open(config_toml)
                except ImportError as e:
                    raise ConfigError(f"tracking.backends: {name!r} could not be imported ({e}): {INSTALL}") from None
                except MMFLError:
                    raise
                except Exception as e:
                    raise MMFLError(f"tracking ({name}): could not start at {probe.location()}: {e}") from None
                b.opened = True
            self._save()
            for row in rows:  # rounds a back-end lacks (added on resume, or a crash before it logged)
                if row.get("round", 0) <= start:
                    self.log(row)
        except BaseException:
            self.close(failed=True)
            raise

    def log(self, row: dict) -> None:
        step = int(row["round"])
        for b in list(self.backends):
            if step <= b.last:
                continue  # logged before a crash or a resume: never twice
            try:
                b.log(row, step)
            except Exception as e:
                self._drop(b, e)
                continue
            b.state["last"] = step
        self._save()

    def finish(self, summary: dict) -> None:
        step = int(summary.get("rounds", 0))
        for b in list(self.backends):
            try:
                b.finish(summary, step)
            except Exception as e:
                self._drop(b, e)

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for b in self.backends:
            self._close(b, failed)
        self._save()

    def _drop(self, b: _Backend, e: Exception) -> None:
        print(f"mmfl: warning: tracking ({b.name}): {type(e).__name__}: {e}; this back-end is off for the "
              "rest of the run (metrics.jsonl has every round)", file=sys.stderr, flush=True)
        self.backends.remove(b)
        self._close(b, True)

    @staticmethod
    def _close(b: _Backend, failed: bool) -> None:
        try:
            if getattr(b, "opened", False):
                b.close(failed)
        except Exception as e:
            print(f"mmfl: warning: tracking ({b.name}): closing failed: {e}", file=sys.stderr, flush=True)
        finally:
            b.restore_env()

    def _save(self) -> None:
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.run_dir / STATE_FILE)
        runfiles.seal(self.run_dir)  # what the back-ends wrote so far (tb/, mlruns/) is the run's: --overwrite


def _load_state(path: Path) -> dict:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}
