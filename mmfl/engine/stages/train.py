"""The round's training: the server's round (its sends, aggregation and server step) over the
transport, at the run's precision; its metrics and the transport's batching info open the row."""

from __future__ import annotations

from mmfl.core.device import precision_context
from mmfl.engine.learning_check import diverged
from mmfl.engine.stages.base import Round, Stage
from mmfl.errors import MMFLError


class Train(Stage):
    """``server.round(rnd, cohort, transport)``; a failure becomes one line."""

    def round(self, r: Round) -> None:
        exp = self.exp
        exp.transport.begin_round(r.rnd)
        r.row.update({"round": r.rnd + 1, "clients": len(r.cohort)})
        with precision_context(exp.device, exp.cfg.run.precision):
            try:
                r.row.update(exp.server.round(r.rnd, r.cohort, exp.transport))
            except MMFLError as e:  # a centralized run that diverged: "lower train.lr"
                raise diverged(e, exp.spec.pooled) from None
            except RuntimeError as e:  # a setting too large for float32 (torch's optimizer step)
                if "without overflow" not in str(e):
                    raise
                raise MMFLError(f"round {r.rnd + 1}: a value overflows float32 in training ({e}); check "
                                "train.lr, train.weight_decay and the algorithm's parameters") from None
        r.row.update(exp.transport.batch_info)  # batched clients, or why not
