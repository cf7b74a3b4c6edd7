"""The tests' one helper for a run: a config from a base list of overrides (or a raw config
dict), an Experiment built and run, its metrics rows (issue 28, item 5).

A test file that trains end to end writes ``from helpers import DIGITS, config, run, rows`` and
passes its own overrides; the defaults are the tiny digits run most files used to hand-roll:
3 clients, an MLP with one hidden layer of 16, one local epoch, SGD, one thread, 2 rounds.
A file whose config is a raw dict (``{"data": {...}, "model": {...}}``) or a Config it built
itself writes ``experiment(raw)`` (built, not run: to spy on its transport or server first) or
``run_config(raw)``.
"""

import json
from pathlib import Path

from mmfl.config import ExperimentConfig, load_config, resolve
from mmfl.engine.runner import Experiment  # the one place the tests' runs name the runner's module

# the tiny digits run (about a second a round on one thread)
DIGITS = ("data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
          "train.local_epochs=1", "train.batch_size=128", 'train.optimizer="sgd"', "train.lr=0.05", "threads=1")
# two mfeat views, Dirichlet labels, 2 of the 4 clients unimodal (FedCMI's case D)
MFEAT_D = ("data.name=mfeat", 'data.views=["pix", "fou"]', 'case="D"', "partition.num_clients=4",
           "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[16]", "train.local_epochs=1",
           "train.batch_size=64", "threads=1", "clients_per_round=3")


def config(tmp_path, name, *overrides, base=DIGITS, rounds: int | None = 2, path=None) -> ExperimentConfig:
    """The run's config: the file ``path`` (none: the defaults), ``base``, then the output folder,
    name and rounds (none when ``rounds`` is None: the base's or the file's), then ``overrides``
    (the last value of a key wins)."""
    head = [*base, f"output_dir={tmp_path}", f"name={name}"]
    if rounds is not None:
        head.append(f"rounds={rounds}")
    return load_config(path, [*head, *overrides])


def experiment(cfg: ExperimentConfig | dict, **kw) -> Experiment:
    """The experiment of ``cfg`` (a Config, or a raw config dict: resolved first), built, not run;
    no progress bar unless ``progress=True``; ``kw`` go to Experiment (``transport``, ``stages``)."""
    kw.setdefault("progress", False)
    return Experiment(resolve(cfg) if isinstance(cfg, dict) else cfg, **kw)


def run_config(cfg: ExperimentConfig | dict, *, resume=False, overwrite=False, **kw) -> Experiment:
    """Build (as :func:`experiment`) and run ``cfg``; returns the experiment."""
    exp = experiment(cfg, **kw)
    exp.run(resume=resume, overwrite=overwrite)
    return exp


def run(tmp_path, name, *overrides, base=DIGITS, rounds: int | None = 2, path=None, resume=False,
        overwrite=False, **kw) -> Experiment:
    """Build and run the experiment of :func:`config` (no progress bar); returns it (``exp.run_dir``,
    ``exp.server``); ``kw`` go to Experiment (``transport``, ``stages``, ``progress``)."""
    return run_config(config(tmp_path, name, *overrides, base=base, rounds=rounds, path=path),
                      resume=resume, overwrite=overwrite, **kw)


def rows(run_or_dir) -> list[dict]:
    """The metrics rows of a run (an Experiment or its run folder), one dict per line."""
    run_dir = Path(getattr(run_or_dir, "run_dir", run_or_dir))
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def timeless(rows_: list[dict]) -> list[dict]:
    """The rows without their wall-clock fields (``*_time_s``): what two equal runs share exactly."""
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rows_]
