"""The round's wall-clock times: ``train_time_s`` (training, up to its reply bookkeeping) and
``wall_time_s`` (the whole round up to its row, evaluation included)."""

from __future__ import annotations

import time

from mmfl.engine.stages.base import Round, Stage


class TrainTime(Stage):
    def round(self, r: Round) -> None:
        r.row["train_time_s"] = time.perf_counter() - r.t0


class WallTime(Stage):
    def round(self, r: Round) -> None:
        r.row["wall_time_s"] = time.perf_counter() - r.t0
