"""The round's row on disk, then its checkpoint: metrics first, so a crash in between leaves a row
newer than the checkpoint, which resume drops (:func:`mmfl.engine.runfolder.truncate_metrics`)."""

from __future__ import annotations

import json
import os

from mmfl.engine.stages.base import Round, Stage


class Metrics(Stage):
    """One JSON line appended to ``metrics.jsonl``, on disk before the checkpoint that says the
    round is done."""

    def round(self, r: Round) -> None:
        with open(self.exp.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(r.row) + "\n")
            f.flush()
            os.fsync(f.fileno())


class Checkpoint(Stage):
    """``Experiment._checkpoint``: every ``checkpoint_every`` rounds and after the last
    (:mod:`mmfl.engine.checkpoint`)."""

    def round(self, r: Round) -> None:
        self.exp._checkpoint(r.rnd)
