"""``[dp]`` in the round loop: the privacy spent so far (``dp/epsilon``, ``dp/delta``: the
accountant of :mod:`mmfl.engine.dp_runtime`), and the check that the transport can apply local DP."""

from __future__ import annotations

from mmfl.engine.cohort import cohort_size, sample_cohort
from mmfl.engine.dp_runtime import DPAccountant
from mmfl.engine.stages.base import Round, Stage
from mmfl.errors import ConfigError


class DPEpsilon(Stage):
    """The accountant's metrics for the rounds done (recomputed from the seeded cohorts, so a
    resumed run writes the same numbers)."""

    @classmethod
    def make(cls, exp) -> "DPEpsilon | None":
        dp = exp.cfg.dp
        if dp is None:
            return None
        if dp.mode == "local" and getattr(exp.transport, "local_dp", None) is None:
            raise ConfigError("dp.mode: local DP is applied by the in-process simulation only; this transport "
                              "has no client-side randomizer (use dp.mode = \"central\")")
        return cls(exp)

    def __init__(self, exp):
        super().__init__(exp)
        cfg, n = exp.cfg, exp.federation.num_clients
        self.accountant = DPAccountant(cfg.dp, cohort_size(cfg, n), n, lambda rnd: sample_cohort(cfg, rnd, n))

    def round(self, r: Round) -> None:
        r.row.update(self.accountant.metrics(r.rnd))
