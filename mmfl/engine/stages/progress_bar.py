"""The run's progress bars on the terminal (:class:`mmfl.engine.progress.RunProgress`): the rounds
bar, and the clients bar inside a round that the transport advances. Last in the list: its
``begin`` runs before any stage's round, its ``round`` after every other stage's."""

from __future__ import annotations

from mmfl.engine.progress import RunProgress
from mmfl.engine.stages.base import Round, Stage


class Progress(Stage):
    @classmethod
    def make(cls, exp) -> "Progress | None":
        return cls(exp) if exp.progress else None

    def start(self, first_round: int) -> None:
        cfg = self.exp.cfg
        self.bar = RunProgress(f"{cfg.run.name} ({cfg.algorithm.name})", first_round, cfg.run.rounds)
        if hasattr(self.exp.transport, "progress"):
            self.exp.transport.progress = self.bar  # clients done inside each round

    def begin(self, r: Round) -> None:
        self.bar.begin_round(r.rnd)

    def round(self, r: Round) -> None:
        self.bar.end_round(r.row)

    def finish(self, summary: dict) -> None:
        self.bar.close()
