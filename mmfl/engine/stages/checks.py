"""Checks on the finished row: a diverged run stops with one line (a non-finite accuracy or
loss), and the one-line note when ``train_loss`` sits at ln K or rises
(:class:`mmfl.engine.learning_check.LearningCheck`)."""

from __future__ import annotations

import numpy as np

from mmfl.engine.learning_check import LearningCheck
from mmfl.engine.stages.base import Round, Stage
from mmfl.errors import MMFLError


def check_finite(row: dict, rnd: int) -> None:
    for k, v in row.items():  # the accuracy and every loss an algorithm reports (train, test, distill, ...)
        if (k == "accuracy" or k.endswith("loss")) and isinstance(v, float) and not np.isfinite(v):
            raise MMFLError(f"round {rnd + 1}: {k} is {v}; training diverged (lower train.lr?)")


class Finite(Stage):
    def round(self, r: Round) -> None:
        check_finite(r.row, r.rnd)


class Learning(Stage):
    def start(self, first_round: int) -> None:
        cfg = self.exp.cfg
        self.check = LearningCheck(self.exp.federation.meta.num_classes, cfg.train.optimizer, cfg.train.lr,
                                   decaying=cfg.train.lr_schedule != "constant")

    def round(self, r: Round) -> None:
        self.check.update(r.row)  # one note per run (learning_check)
