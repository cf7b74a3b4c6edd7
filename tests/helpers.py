"""The tests' one helper for a run: a config from a base list of overrides, an Experiment run,
its metrics rows (issue 28, item 5).

A test file that trains end to end writes ``from helpers import DIGITS, config, run, rows`` and
passes its own overrides; the defaults are the tiny digits run most files used to hand-roll:
3 clients, an MLP with one hidden layer of 16, one local epoch, SGD, one thread, 2 rounds.
"""

import json
from pathlib import Path

from mmfl.config import load_config
from mmfl.engine.runner import Experiment  # the one place the tests' runs name the runner's module

# the tiny digits run (about a second a round on one thread)
DIGITS = ("data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
          "train.local_epochs=1", "train.batch_size=128", 'train.optimizer="sgd"', "train.lr=0.05", "threads=1")
# two mfeat views, Dirichlet labels, 2 of the 4 clients unimodal (FedCMI's case D)
MFEAT_D = ("data.name=mfeat", 'data.views=["pix", "fou"]', 'case="D"', "partition.num_clients=4",
           "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[16]", "train.local_epochs=1",
           "train.batch_size=64", "threads=1", "clients_per_round=3")


def config(tmp_path, name, *overrides, base=DIGITS, rounds: int | None = 2):
    """The run's config: ``base``, then the output folder, name and rounds (none when ``rounds`` is
    None: the base's or the default), then ``overrides`` (the last value of a key wins)."""
    head = [*base, f"output_dir={tmp_path}", f"name={name}"]
    if rounds is not None:
        head.append(f"rounds={rounds}")
    return load_config(None, [*head, *overrides])


def run(tmp_path, name, *overrides, base=DIGITS, rounds: int | None = 2, resume=False, overwrite=False) -> Experiment:
    """Build and run the experiment (no progress bar); returns it (``exp.run_dir``, ``exp.server``)."""
    exp = Experiment(config(tmp_path, name, *overrides, base=base, rounds=rounds), progress=False)
    exp.run(resume=resume, overwrite=overwrite)
    return exp


def rows(run_or_dir) -> list[dict]:
    """The metrics rows of a run (an Experiment or its run folder), one dict per line."""
    run_dir = Path(getattr(run_or_dir, "run_dir", run_or_dir))
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def timeless(rows_: list[dict]) -> list[dict]:
    """The rows without their wall-clock fields (``*_time_s``): what two equal runs share exactly."""
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rows_]
