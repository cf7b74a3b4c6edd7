"""``[tracking]`` in the round loop (:mod:`mmfl.engine.tracking`): the trackers opened with the run
folder, fed each row after it is on disk and before the checkpoint (so a resume never logs a
round twice), given the summary, and closed (as failed after an error or an interrupt)."""

from __future__ import annotations

from mmfl.engine import runfiles
from mmfl.engine.stages.base import Round, Stage
from mmfl.engine.tracking import Tracking
from mmfl.report import load_metrics


class Track(Stage):
    @classmethod
    def make(cls, exp) -> "Track | None":
        return None if exp.cfg.tracking is None else cls(exp)

    def __init__(self, exp):
        super().__init__(exp)
        self.tracking: Tracking | None = None  # opened with the run folder

    def start(self, first_round: int) -> None:
        cfg, d = self.exp.cfg, self.exp.run_dir
        if not cfg.tracking.dir:  # the trackers write inside the run folder
            runfiles.record(d, "tracking.json", *({"tensorboard": "tb/", "mlflow": "mlruns/"}.get(b, b + "/")
                                                  for b in cfg.tracking.backends))
        else:
            runfiles.record(d, "tracking.json")
        self.tracking = Tracking(cfg, d, first_round, load_metrics(d) if first_round else [])

    def round(self, r: Round) -> None:
        self.tracking.log(r.row)

    def finish(self, summary: dict) -> None:
        self.tracking.finish(summary)

    def close(self, failed: bool) -> None:
        if self.tracking is not None:
            self.tracking.close(failed=failed)  # a no-op after the run's first close
