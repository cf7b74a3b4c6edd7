"""The runtime side of ``[dp]`` (docs/dp.md): local DP's randomizer applied to each client's reply
before it leaves the client (the simulation transport calls it), and the accountant's per-round
``dp/epsilon`` / ``dp/delta`` for metrics.jsonl. Central DP's noise is added by the server
(:meth:`mmfl.algorithms.fedavg.FedAvgServer.aggregate`); the math is :mod:`mmfl.core.dp`.
Sample-level DP-SGD (``mode = "sample"``) runs in the clients' local training
(:mod:`mmfl.core.dpsgd`), each client keeping its own accountant; here only the check that the
models allow per-sample gradients (:func:`check_dpsgd_models`).

Every noise draw comes from a derived seed (run seed, round, client, "dp-local"), and epsilon is
recomputed from the round index and the seeded cohorts, so a resumed run is bit-exact.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from mmfl.core.dp import central_epsilon, local_epsilon, local_privatize
from mmfl.core.dpsgd import model_blocker
from mmfl.core.message import Message
from mmfl.errors import ConfigError
from mmfl.schema import DPConfig
from mmfl.seeds import derive_seed


class LocalDP:
    """Local DP's randomizer: the reply's model entries (the floating arrays it shares with the
    model the client received) become ``w^t + clip(w_k - w^t, C) + N(0, (z C)^2 I)``."""

    def __init__(self, dp: DPConfig, seed: int):
        self.dp = dp
        self.seed = seed

    def __call__(self, rnd: int, cid: int, msg: Message, reply: Message) -> Message:
        previous = {k: v for k, v in msg.arrays.items() if v.is_floating_point()}
        arrays = local_privatize(reply.arrays, previous, self.dp.clip_norm, self.dp.noise_multiplier,
                                 derive_seed(self.seed, rnd, cid, "dp-local"))
        return Message(arrays=arrays, scalars=dict(reply.scalars))


class DPAccountant:
    """``dp/epsilon`` after each round at ``dp/delta``.

    central: the subsampled Gaussian mechanism composed over the rounds so far, q = n / N (n: the
    cohort size). local: the largest number of rounds any client has taken part in (from the seeded
    cohorts ``cohort_of(rnd)``), each a Gaussian mechanism of multiplier z / 2 (sensitivity 2C)."""

    def __init__(self, dp: DPConfig, cohort_size: int, num_clients: int, cohort_of: Callable[[int], list[int]]):
        self.dp = dp
        self.q = cohort_size / num_clients
        self.cohort_of = cohort_of
        self._counts: dict[int, int] = {}
        self._counted = 0  # rounds whose cohorts are in _counts

    def metrics(self, rnd: int) -> dict[str, float]:
        """The row entries after round ``rnd`` (0-based) has finished."""
        dp = self.dp
        if dp.mode in ("sample", "rows"):  # each client's own accountant: the server reports them
            return {}
        if dp.mode == "central":
            eps = central_epsilon(self.q, dp.noise_multiplier, rnd + 1, dp.delta)
        else:
            while self._counted <= rnd:
                for c in self.cohort_of(self._counted):
                    self._counts[c] = self._counts.get(c, 0) + 1
                self._counted += 1
            eps = local_epsilon(dp.noise_multiplier, max(self._counts.values(), default=0), dp.delta)
        return {"dp/epsilon": eps, "dp/delta": dp.delta}


def per_sample_dpsgd(cfg) -> bool:
    """Whether ``cfg`` runs DP-SGD with per-sample clipping (its models must allow per-sample
    gradients): ``[dp] mode = "sample"`` and an algorithm whose server does not declare
    ``dp_sample_unit = "batch"`` (FedCMI, CreamFL: batch-level clipping, mmfl.core.dp_rows)."""
    from mmfl.algorithms.registry import ALGORITHMS

    if cfg.dp is None or cfg.dp.mode != "sample":
        return False
    return getattr(ALGORITHMS.get(cfg.algorithm.name).factory.server, "dp_sample_unit", "sample") == "sample"


def check_dpsgd_models(models: list[tuple[str, nn.Module]]) -> None:
    """``[dp] mode = "sample"``: a one-line ConfigError naming the first module of ``models`` ((model
    table name, a built client model) pairs) that DP-SGD cannot train (:func:`mmfl.core.dpsgd.model_blocker`).
    No automatic replacement (Opacus's ``ModuleValidator.fix``): the server's model would differ."""
    for name, model in models:
        why = model_blocker(model)
        if why is not None:
            hint = "a model without BatchNorm (resnet: model.norm = \"group\")" if "BatchNorm" in why else \
                "a model without this module"
            raise ConfigError(f"dp.mode: DP-SGD (mode = \"sample\") cannot train model '{name}': {why}; use {hint}")
