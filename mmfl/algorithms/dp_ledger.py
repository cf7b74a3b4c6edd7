"""The clients' own DP accountants for the algorithms outside the FedAvg family (docs/dp.md):
the client counts what it released and sends its epsilon as the reply scalar ``dp/epsilon``;
the server keeps each client's latest value in its declared state and writes ``dp/epsilon``
(the largest), ``dp/epsilon_mean`` and ``dp/delta`` to the metrics row, as
:class:`~mmfl.algorithms.fedavg.FedAvgServer` does for DP-SGD.

``[dp] mode = "rows"`` (per-row Gaussian mechanism, :mod:`mmfl.core.dp_rows`): the client keeps
``dp/releases`` in its persistent state, the number of times each of its rows has been released
(an upper bound: every release event counts for every row), and its epsilon is
:func:`mmfl.core.dp_rows.row_epsilon` of that count.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmfl.core.dp import client_epsilon_metrics, local_privatize
from mmfl.core.dp_rows import privatize_rows, row_epsilon
from mmfl.core.message import Message
from mmfl.core.state import read, scalar, tensor, write
from mmfl.seeds import derive_seed

RELEASES = "dp/releases"  # client state: how many times each of its rows has been released ([dp] mode = "rows")


def rows_dp(ctx):
    """The run's ``[dp]`` when its mode is "rows" (else None)."""
    dp = getattr(ctx, "dp", None)
    return dp if dp is not None and dp.mode == "rows" else None


def release_rows(ctx, x: Tensor, what: str) -> Tensor:
    """``x`` ``[n, ...]`` (one vector per row) through the per-row Gaussian mechanism, seeded by the
    message's seed and ``what``."""
    dp = ctx.dp
    return privatize_rows(x, dp.clip_norm, dp.noise_multiplier, derive_seed(ctx.seed, "dp-rows", what))


def release_model(ctx, arrays: dict[str, Tensor], previous: dict[str, Tensor], what: str,
                  trainable: set[str]) -> dict[str, Tensor]:
    """A model the client sends: its ``trainable`` entries through local DP's randomizer
    (``w^t + clip(w - w^t, C) + N(0, (z C)^2)`` against ``previous``, the weights it started from;
    the same mechanism per release as a row's); every other entry (BatchNorm's running statistics,
    which private training leaves as received, :class:`mmfl.core.dp_rows.fixed_batchnorm`) goes
    back as it came."""
    dp = ctx.dp
    out = dict(arrays)
    out.update({k: previous[k] for k in arrays if k not in trainable and k in previous})
    params = {k: v for k, v in arrays.items() if k in trainable}
    out.update(local_privatize(params, {k: previous[k] for k in params}, dp.clip_norm, dp.noise_multiplier,
                               derive_seed(ctx.seed, "dp-rows", what)))
    return out


def count_releases(ctx, k: int) -> float | None:
    """Add ``k`` releases of every row to the client's count; its epsilon so far (None with z = 0:
    inf, not sent, reply scalars are finite)."""
    n = int(read(ctx.state, RELEASES, scalar()) or 0) + int(k)
    write(ctx.state, RELEASES, n, scalar())
    dp = ctx.dp
    return row_epsilon(dp.noise_multiplier, n, dp.delta) if dp.noise_multiplier > 0 else None


def with_epsilon(reply: Message, eps: float | None) -> Message:
    if eps is not None:
        reply.scalars["dp/epsilon"] = float(eps)
    return reply


class EpsilonLedger:
    """Server mixin: each client's latest ``dp/epsilon`` (state field ``dp_epsilon``, add
    :data:`LEDGER_FIELDS` to ``state_fields``) and the row entries."""

    dp_epsilon = None

    def note_dpsgd_epsilon(self, cid: int, reply: Message | None) -> None:
        if reply is None or "dp/epsilon" not in reply.scalars:
            return
        if self.dp_epsilon is None:
            self.dp_epsilon = torch.zeros(self.ctx.num_clients, dtype=torch.float64, device=self.ctx.device)
        self.dp_epsilon[cid] = float(reply.scalars["dp/epsilon"])

    def dpsgd_metrics(self) -> dict[str, float]:
        """``dp/epsilon`` (largest of any client so far), ``dp/epsilon_mean`` and ``dp/delta``; {}
        without [dp]. With ``noise_multiplier = 0``: inf."""
        dp = self.ctx.dp
        if dp is None:
            return {}
        return client_epsilon_metrics(dp, self.dp_epsilon)


LEDGER_FIELDS = {"dp_epsilon": tensor()}
