"""Evaluation every ``run.eval_every`` rounds and after the last: the server's declared
evaluations (:mod:`mmfl.core.evaluation`) in fp32 whatever the precision (the metrics describe
the model, not bf16 rounding); the bytes they exchange go to ``eval_bytes_*``, apart from the
training conversation's."""

from __future__ import annotations

from mmfl.core.evaluation import run_evaluations
from mmfl.engine.stages.base import Round, Stage


class Evaluate(Stage):
    def round(self, r: Round) -> None:
        exp, run = self.exp, self.exp.cfg.run
        if (r.rnd + 1) % run.eval_every and r.rnd + 1 != run.rounds:
            return
        exp.transport.log.reset()
        r.evaluated = True
        r.row.update(run_evaluations(exp.server, exp.evaluations(), exp.eval_context(r.rnd)))
        ev = exp.transport.log.summary()
        if ev["bytes_down"] or ev["bytes_up"]:
            r.row["eval_bytes_down"], r.row["eval_bytes_up"] = ev["bytes_down"], ev["bytes_up"]
