"""``[system]`` in the round loop: the round's simulated latency (``sim_*``, :mod:`mmfl.core.system`)
from the training conversation's bytes per client (not evaluation's), and ``sim_time_total_s``
over the run, a resumed run's earlier rounds included."""

from __future__ import annotations

from mmfl.engine.stages.base import Round, Stage
from mmfl.report import load_metrics


class Latency(Stage):
    @classmethod
    def make(cls, exp) -> "Latency | None":
        return None if exp.system is None else cls(exp)

    def start(self, first_round: int) -> None:
        path = self.exp.run_dir / "metrics.jsonl"  # simulated seconds of the rounds already there
        self.total = float(sum(r.get("sim_time_s", 0.0) for r in load_metrics(self.exp.run_dir))) \
            if path.is_file() else 0.0

    def round(self, r: Round) -> None:
        r.row.update(self.exp.system.round_latency(r.rnd, r.train_comm["bytes_per_client"]))
        self.total += r.row["sim_time_s"]
        r.row["sim_time_total_s"] = self.total
