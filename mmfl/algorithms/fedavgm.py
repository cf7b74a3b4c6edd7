"""FedAvgM (Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution
for federated visual classification", Sect. 3): FedAvg whose server applies momentum to the
round's update. With w^t the global model and avg_t the clients' aggregate (the named rule,
FedAvg's data-weighted mean by default):

    Delta_t = avg_t - w^t                          (the FedAvg step; -Delta_t is the pseudo-gradient)
    v_t     = beta * v_{t-1} + Delta_t             (Sect. 3: server momentum, v_0 = 0)
    w^{t+1} = w^t + server_lr * v_t                (FedOpt's notation, Reddi et al. 2021, Alg. 1)

beta = 0, server_lr = 1 is FedAvg. The momentum covers the floating-point entries of the model
state (parameters and float buffers); integer buffers (e.g. BatchNorm's counter) take the
aggregate. Clients are FedAvg's. v is declared state, so a resumed run continues it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.algorithms.registry import register
from mmfl.core.state import tensors
from mmfl.errors import ConfigError


@dataclass
class FedAvgMParams(FedAvgParams):
    server_momentum: float = field(default=0.9, metadata={
        "help": "beta: server momentum in [0, 1) (Hsu et al. sweep 0-0.997; 0 = FedAvg)"})
    server_lr: float = field(default=1.0, metadata={
        "help": "server learning rate > 0 (Hsu et al.: 1 with beta, or scaled by 1 - beta)"})

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.server_momentum < 1:
            raise ConfigError(f"algorithm.server_momentum: must be in [0, 1), got {self.server_momentum}")
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr: must be > 0, got {self.server_lr}")


def momentum_step(w: dict[str, Tensor], avg: dict[str, Tensor], v: dict[str, Tensor], beta: float,
                  lr: float) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One server step (Sect. 3): ``(w^{t+1}, v_t)`` from the global state ``w``, the round's
    aggregate ``avg`` and the velocity ``v`` (same names and shapes; a name absent from ``v``
    starts at 0). Integer entries of ``avg`` pass through and get no velocity."""
    new_w, new_v = {}, {}
    for k, a in avg.items():
        if not torch.is_floating_point(a):
            new_w[k] = a
            continue
        new_v[k] = beta * v[k] + (a - w[k]) if k in v else a - w[k]
        new_w[k] = w[k] + lr * new_v[k]
    return new_w, new_v


class FedAvgMServer(FedAvgServer):
    state_fields = {"velocity": tensors()}  # v_{t-1}, per model entry ({} before round 1)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.velocity: dict[str, Tensor] = {}

    def server_step(self, rnd: int, previous: dict[str, Tensor], averaged: dict[str, Tensor]) -> dict[str, Tensor]:
        # the hook after the (listed or streamed) aggregate: FedAvgM keeps streaming aggregation
        w, self.velocity = momentum_step(previous, averaged, self.velocity,
                                         self.params.server_momentum, self.params.server_lr)
        return w


register("fedavgm", FedAvgMParams, FedAvgMServer, FedAvgClient,
         help="FedAvgM: FedAvg with server momentum beta on the round's update (Hsu et al. 2019)")
