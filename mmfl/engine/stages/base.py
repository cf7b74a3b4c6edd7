"""What a round stage is: :class:`Stage` (its hooks) and :class:`Round` (what the stages of one
round share). The runner walks the declared list (:data:`mmfl.engine.pipeline.STAGES`):

- ``start(first_round)`` once, in list order, after the run folder is ready (``first_round``:
  0, or the round a resume continues from);
- each round, ``begin(r)`` of every stage, then ``round(r)`` of every stage, in list order;
- ``finish(summary)`` once after ``summary.json`` is written, in reverse list order;
- ``close(failed)`` when the run ends, in reverse list order: ``failed=False`` after a
  finished run, then ``failed=True`` whatever happened (an error, an interrupt); the second
  call after a finished run must do nothing.

A stage writes into ``r.row``, the round's metrics row: the keys appear in metrics.jsonl in
the order the stages add them. A stage that does not apply to a run (no ``[dp]`` table, ...)
returns None from :meth:`Stage.make`. Stages read the run from ``self.exp`` (the
:class:`~mmfl.engine.runner.Experiment`: ``cfg``, ``server``, ``transport``, ``federation``,
``store``, ``run_dir``, ...) and must not change its result unless that is their purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Round:
    """One round as it passes through the stages."""

    rnd: int  # 0-based; the row says "round": rnd + 1
    t0: float  # time.perf_counter() when the round began
    cohort: list[int]  # the clients sampled for it
    row: dict = field(default_factory=dict)  # the metrics row being built
    train_comm: dict = field(default_factory=dict)  # the training conversation's bytes (before evaluation)
    dropped: list[int] = field(default_factory=list)  # clients dropped so far
    rejected: list = field(default_factory=list)  # replies rejected so far (mmfl.core.replies)
    evaluated: bool = False  # an evaluation ran this round (the byte log was reset for it)
    extra: dict[str, Any] = field(default_factory=dict)  # what a stage leaves for a later one


class Stage:
    """A step of every round (and, optionally, of the run's start and end). Subclasses override
    the hooks they need; each is a no-op here."""

    def __init__(self, exp):
        self.exp = exp  # the Experiment (not imported: the runner imports the stages)

    @classmethod
    def make(cls, exp) -> "Stage | None":
        """This stage for ``exp``'s run, or None when it does not apply. Runs at the end of
        ``Experiment.__init__``: a config the stage cannot serve raises ``ConfigError`` here,
        before any folder is touched."""
        return cls(exp)

    def start(self, first_round: int) -> None:
        """Before the first round this process runs."""

    def begin(self, r: Round) -> None:
        """Before any stage's :meth:`round` of round ``r``."""

    def round(self, r: Round) -> None:
        """This stage's work in round ``r``."""

    def finish(self, summary: dict) -> None:
        """After the run's last round and its ``summary.json``."""

    def close(self, failed: bool) -> None:
        """Release what the stage holds (called twice after a finished run; see above)."""
