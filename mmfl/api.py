"""The Python API: run an experiment and read its results, from a notebook or a script.

    import mmfl

    res = mmfl.run("demo.toml", rounds=3, threads=1, algorithm__mu=0.1)   # -> Result
    res.metrics                 # pandas DataFrame of metrics.jsonl, one row per round
    res.summary                 # summary.json as a dict
    res.model()                 # the final server model (torch.nn.Module, eval mode)
    res.evaluate()              # that model on the run's test set: accuracy, test_loss, ...
    res.class_names             # label i's name
    res.partition()             # client x class counts (and rows holding each modality), a DataFrame
    mmfl.partition("demo.toml") # the same before a run
    res = mmfl.run("demo.toml", reference=True); res.reference   # + centralized/local/sklearn references
    res = mmfl.load_run("runs/demo")   # the same for a finished run folder

``config`` is a path to a TOML file, a dict of the same structure, or an
:class:`~mmfl.schema.ExperimentConfig`. Overrides are the CLI's ``--set``: keyword
arguments whose ``__`` stands for the dot of a table (``algorithm__mu=0.1`` is
``--set algorithm.mu=0.1``), and/or ``set=``, a dict of dotted keys to Python values
(``set={"algorithm.mu": 0.1}``) or a list of the CLI's ``"key=value"`` strings (values
are TOML literals). ``set`` is applied first, then the keywords; a value replaces what the
key held (a dict replaces a whole table). Errors are :class:`mmfl.errors.MMFLError`
(:class:`~mmfl.errors.ConfigError` for a config value) with the line the CLI prints after
``mmfl: error:``.

This module imports no torch at import time; running, loading a model and reading the
metrics import what they need.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mmfl.config_raw import apply_overrides, load_raw
from mmfl.errors import ConfigError, MMFLError

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import torch

    from mmfl.schema import ExperimentConfig

KINDS = ("algorithm", "dataset", "partition", "modality", "model", "aggregation")


# ----------------------------------------------------------------------------- config

def _set_dotted(raw: dict, key: str, value: Any, where: str) -> None:
    keys = key.split(".")
    if not all(keys):
        raise ConfigError(f"{where}: empty key")
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {k} is not a table")
    node[keys[-1]] = _plain(value)


def _plain(value: Any) -> Any:
    """A Python value as the TOML reader would give it (paths as strings, tuples as lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():  # numpy scalar
        return value.item()
    return value


def raw_config(config, set: Mapping[str, Any] | list[str] | None = None, **overrides) -> dict:  # noqa: A002
    """The raw config dict (before validation) of ``config`` with the overrides applied."""
    if isinstance(config, (str, Path)):
        raw = load_raw(Path(config).expanduser())
    elif isinstance(config, Mapping):
        import copy

        raw = copy.deepcopy(dict(config))
    elif hasattr(config, "to_toml") and hasattr(config, "run"):  # an ExperimentConfig
        import tomllib

        raw = tomllib.loads(config.to_toml())
    else:
        raise ConfigError(f"config: expected a TOML path, a dict or an ExperimentConfig, got {type(config).__name__}")
    if isinstance(set, (list, tuple)):
        raw = apply_overrides(raw, [str(s) for s in set])
    elif set is not None:
        if not isinstance(set, Mapping):
            raise ConfigError(f"set: expected a dict of dotted keys or a list of 'key=value' strings, got {set!r}")
        for key, value in set.items():
            _set_dotted(raw, str(key), value, f"set {key!r}")
    for key, value in overrides.items():
        _set_dotted(raw, key.replace("__", "."), value, key)
    return raw


def configure(config, set: Mapping[str, Any] | list[str] | None = None,  # noqa: A002
              **overrides) -> "ExperimentConfig":
    """The validated :class:`~mmfl.schema.ExperimentConfig` of ``config`` + overrides (runs nothing)."""
    raw = raw_config(config, set, **overrides)  # a missing file is reported before the registries load
    from mmfl.config import resolve

    return resolve(raw)


def run(config, *, set: Mapping[str, Any] | list[str] | None = None,  # noqa: A002
        resume: bool = False, overwrite: bool = False, progress: bool = True, reference: bool | None = None,
        **overrides) -> "Result":
    """Run an experiment (``mmfl run``) and return its :class:`Result`.

    ``resume``: continue the run folder from its last checkpoint (only ``rounds`` may
    differ); ``overwrite``: replace an existing run folder; ``progress``: the progress bar;
    ``reference``: also train the references (``mmfl run --reference``: centralized, local-only,
    scikit-learn on the pooled rows; simulation only, docs/reference.md) and read them from
    :attr:`Result.reference`; None: as the config's ``[reference]`` table says (off without one)."""
    cfg = configure(config, set, **overrides)
    from mmfl.engine.runner import Experiment

    if reference and cfg.reference is None:
        from mmfl.schema import ReferenceConfig

        cfg.reference = ReferenceConfig()  # recorded in config.toml
    summary = Experiment(cfg, progress=progress).run(resume=resume, overwrite=overwrite)
    if reference or (reference is None and cfg.reference is not None and cfg.reference.enabled):
        from mmfl.reference import run_references

        run_references(cfg, progress=progress)
    return Result(cfg.run_dir, config=cfg, summary=summary)


def load_run(path: str | Path) -> "Result":
    """The :class:`Result` of a run folder written by ``mmfl run`` (finished or not)."""
    from mmfl.engine.runfolder import is_run_folder

    d = Path(path).expanduser()
    if not d.is_dir():
        raise MMFLError(f"{d}: no such run folder")
    if not (d / "config.toml").is_file() or not is_run_folder(d):
        raise MMFLError(f"{d}: not an mmfl run folder (no config.toml written by mmfl run)")
    return Result(d)


def partition(config, set: Mapping[str, Any] | list[str] | None = None,  # noqa: A002
              wide: bool = False, **overrides) -> "pandas.DataFrame":
    """The partition of ``config`` + overrides (what ``mmfl partition`` prints) as a DataFrame,
    before any run: one row per client x class with its ``count`` and the rows holding each
    modality (:mod:`mmfl.data.partition_frame`); ``wide=True``: clients x class names, the counts."""
    cfg = configure(config, set, **overrides)
    from mmfl.data.federation import build_federation
    from mmfl.data.partition_frame import partition_frame

    return partition_frame(build_federation(cfg), wide=wide)


def registries() -> dict:
    """kind -> its :class:`~mmfl.registry.Registry` (:data:`KINDS`; imports the package: torch)."""
    from mmfl.algorithms import ALGORITHMS
    from mmfl.core.aggregation import AGGREGATION_RULES
    from mmfl.data import DATASETS, PARTITIONERS
    from mmfl.data.modality import MODALITY_ASSIGNERS
    from mmfl.models import MODELS

    return {"algorithm": ALGORITHMS, "dataset": DATASETS, "partition": PARTITIONERS,
            "modality": MODALITY_ASSIGNERS, "model": MODELS, "aggregation": AGGREGATION_RULES}


def list_entries(kind: str) -> dict[str, str]:
    """``mmfl.list(kind)``: name -> one-line help of the registered entries of ``kind``
    (one of :data:`KINDS`); ``mmfl list KIND`` prints them with their parameters."""
    if kind not in KINDS:
        raise ConfigError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    return {e.name: e.help for e in registries()[kind].entries()}


# ----------------------------------------------------------------------------- results

class Result:
    """A run folder's results. Everything is read from the folder when first asked for
    (``load_run`` of a finished run gives the same as the ``run`` that wrote it)."""

    def __init__(self, run_dir: str | Path, config: "ExperimentConfig | None" = None,
                 summary: dict | None = None):
        self.run_dir = Path(run_dir)
        self._config = config
        self._summary = summary
        self._federation = None

    def __repr__(self) -> str:
        return f"Result({str(self.run_dir)!r})"

    # --- paths ----------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.toml"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.run_dir / "summary.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def plot_path(self) -> Path:
        """Where :meth:`plot` draws test accuracy per round (a run does not draw it itself)."""
        return self.run_dir / "accuracy.png"

    def plot(self) -> Path:
        """Draw ``accuracy.png`` (test accuracy per round, from ``metrics.jsonl``) and return its path;
        what ``mmfl report RUN`` and ``mmfl run --plot`` write."""
        from mmfl.report import plot_accuracy

        from mmfl.engine import runfiles

        runfiles.record(self.run_dir, self.plot_path.name)  # the run's (what --overwrite may delete)
        plot_accuracy({self.run_dir.name: self.rows}, self.plot_path)
        return self.plot_path

    # --- what the run wrote -----------------------------------------------
    @property
    def config(self) -> "ExperimentConfig":
        """The resolved config (every default filled in); ``.config_toml`` is its TOML text."""
        if self._config is None:
            from mmfl.config import load_config

            self._config = load_config(self.config_path)
        return self._config

    @property
    def config_toml(self) -> str:
        """``config.toml`` of the run folder: the resolved config as TOML."""
        return self.config_path.read_text()

    @property
    def rows(self) -> list[dict]:
        """``metrics.jsonl`` as a list of dicts (one per round)."""
        from mmfl.report import load_metrics

        return load_metrics(self.run_dir)

    @property
    def metrics(self) -> "pandas.DataFrame":
        """``metrics.jsonl`` as a DataFrame: one row per round, one column per key (a key some
        rounds lack, e.g. ``accuracy`` with ``eval_every > 1``, is NaN there; list values such
        as ``class_accuracy`` stay lists)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    @property
    def summary(self) -> dict:
        """``summary.json``: final and best accuracy, bytes, time, ... (written when the run finishes)."""
        if self._summary is None:
            if not self.summary_path.is_file():
                raise MMFLError(f"{self.run_dir}: no summary.json (the run has not finished; "
                                "continue it with mmfl run --resume)")
            self._summary = json.loads(self.summary_path.read_text())
        return self._summary

    @property
    def reference(self) -> "pandas.DataFrame | None":
        """The run's references (``mmfl run --reference``; docs/reference.md) as a DataFrame: one row
        per method, the federated run first; columns ``method``, ``metric``, ``final``, ``best``,
        ``uar``, ``note`` (a reference that does not apply has no numbers and says why in ``note``).
        Pooled data, simulation only. None: the run has no references."""
        import pandas as pd

        from mmfl.report import reference_rows

        rows = reference_rows(self.run_dir)
        return None if rows is None else pd.DataFrame(rows)

    @property
    def client_accuracy(self) -> "pandas.DataFrame | None":
        """A personalized run's per-client accuracies: one row per evaluated round (index
        ``round``), one column per client (NaN: no test rows or no answer); None when the
        run reports none (``client_accuracy`` or ``<prefix>client_accuracy`` in its rows)."""
        import pandas as pd

        rows = self.rows
        keys = [k for r in rows for k in r if k.endswith("client_accuracy") and isinstance(r[k], list)]
        if not keys:
            return None
        key = keys[-1]
        per = {r["round"]: r[key] for r in rows if isinstance(r.get(key), list)}
        df = pd.DataFrame.from_dict(per, orient="index", dtype=float)
        df.index.name = "round"
        df.columns.name = "client"
        return df

    @property
    def class_names(self) -> list[str]:
        """The names of the run's classes (label ``i`` is ``class_names[i]``; ``"0"``, ``"1"``, ...
        where the data set names none)."""
        from mmfl.data.partition_frame import class_names

        return class_names(self.federation().meta)

    def partition(self, wide: bool = False) -> "pandas.DataFrame":
        """The run's partition: one row per client x class (``client``, ``label``, ``class``,
        ``count``, then per modality the rows holding it); ``wide=True``: clients x class names
        (Flower Datasets' ``compute_counts`` shape). The run's own federation: a pooled algorithm
        (``centralized``) has one client. See :func:`partition` for a config before a run."""
        from mmfl.data.partition_frame import partition_frame

        return partition_frame(self.federation(), wide=wide)

    # --- models -----------------------------------------------------------
    def checkpoint(self) -> tuple[dict, Any, dict]:
        """``(server tensors, client tensors, meta)`` of the newest intact checkpoint."""
        from mmfl.engine import checkpoint

        ckpt = checkpoint.latest(self.checkpoints_dir)
        if ckpt is None:
            raise MMFLError(f"{self.run_dir}: no checkpoint (checkpoints/LATEST); the run saved no round yet")
        return checkpoint.load(ckpt, lazy_clients=True)

    def federation(self):
        """The run's federation (its data, partition and test set), built once from its config."""
        if self._federation is None:
            from mmfl.algorithms import ALGORITHMS
            from mmfl.data.federation import build_federation

            cfg = self.config
            self._federation = build_federation(cfg, pooled=ALGORITHMS.get(cfg.algorithm.name).factory.pooled)
        return self._federation

    def model(self, client: int | None = None) -> "torch.nn.Module":
        """The final server model (``model/*`` of the last checkpoint's server state) in eval
        mode; ``client=c``: client ``c``'s own model (``model/*`` of its state, personalized
        algorithms such as FedFomo, FedAMP, SOLO), built for the modalities it holds."""
        from mmfl.core.training import load_into
        from mmfl.models.factory import model_factory

        fed = self.federation()
        make = model_factory(self.config, fed.meta)
        server, clients, meta = self.checkpoint()
        if client is None:
            model, arrays, where = make(), server, "server"
        else:
            if not 0 <= client < fed.num_clients:
                raise MMFLError(f"client: must be in 0..{fed.num_clients - 1}, got {client}")
            prefix = f"{client}/"
            arrays = {k[len(prefix):]: clients[k] for k in clients.keys() if k.startswith(prefix + "model/")}
            model, where = make(fed.modalities_of(client), fed.group_of(client), fed.meta_of(client)), \
                f"client {client}"
        if not any(k.startswith("model/") for k in arrays):
            raise MMFLError(f"{self.run_dir}: the {where} state of checkpoint round {meta.get('round')} holds no "
                            f"model (algorithm {self.config.algorithm.name!r} keeps none there)")
        try:
            load_into(model, arrays, prefix="model/")
        except RuntimeError as e:
            raise MMFLError(f"{self.run_dir}: the {where} weights do not fit the run's model "
                            f"({str(e).splitlines()[0]})") from None
        return model.eval()

    def evaluate(self, model: "torch.nn.Module | None" = None, client: int | None = None) -> dict:
        """``model`` (default: :meth:`model`) on the run's shared test set: accuracy, test_loss
        (and per-modality numbers for a multimodal model), as the run's ``global`` evaluation.
        ``client=c``: on client ``c``'s personalized test rows (its label distribution, its
        modalities; :mod:`mmfl.core.personal`), default model ``model(client=c)``: the number
        the run logged in ``client_accuracy[c]``."""
        from mmfl.core.evaluation import global_metrics

        fed = self.federation()
        if client is None:
            from mmfl.algorithms import ALGORITHMS

            server = ALGORITHMS.get(self.config.algorithm.name).factory.server  # the heads the run trains
            heads = server.trains_heads(self.config.algorithm.params)
            return global_metrics(self.model() if model is None else model, fed.test, fed.meta.num_classes,
                                  modality_heads=heads)
        from mmfl.core.personal import device_metrics, held_test_set, personal_test_indices

        model = self.model(client=client) if model is None else model
        rows = personal_test_indices(fed, fed.test, self.config.run.seed, fed.meta.num_classes)[client]
        return device_metrics(model, held_test_set(fed.test, fed.modalities_of(client), rows), fed.meta.num_classes)
