"""FedAdagrad, FedYogi and FedAdam (Reddi et al. 2021, "Adaptive Federated Optimization",
ICLR, Algorithm 2): FedAvg's clients, a server that runs an adaptive optimizer on the round's
update. With x_t the global model and Delta_t the round's aggregate update (the named rule's
average of the clients' models minus x_t; the paper: the mean of the client updates):

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t                         (Alg. 2: first moment)
    FedAdagrad: v_t = v_{t-1} + Delta_t^2                             (Alg. 2: FedAdagrad's v)
    FedYogi:    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (FedYogi's v)
    FedAdam:    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2           (Alg. 2: FedAdam's v)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)                       (Alg. 2: the server step)

elementwise, with m_{-1} = 0 and v_{-1} = tau^2 (the paper asks v_{-1} >= tau^2), no bias
correction (Alg. 2 has none). Defaults: tau = 1e-3, beta1 = 0.9, beta2 = 0.99 (the paper's
experiments); the server learning rate eta is tuned per task in the paper, 0.01 here.
The step is ``FedAvgServer.server_step``, so the aggregation rule, DP and streaming aggregation
are FedAvg's. m and v are declared state: a resumed run continues them bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.algorithms.registry import register
from mmfl.core.state import tensors
from mmfl.errors import ConfigError

VARIANTS = ("adagrad", "yogi", "adam")


@dataclass
class FedAdagradParams(FedAvgParams):
    server_lr: float = field(default=0.01, metadata={
        "help": "eta: the server learning rate > 0 (Reddi et al. tune it per task)"})
    beta1: float = field(default=0.9, metadata={"help": "first-moment decay in [0, 1) (Reddi et al.: 0.9)"})
    tau: float = field(default=1e-3, metadata={
        "help": "adaptivity tau > 0 added to sqrt(v); v starts at tau^2 (Reddi et al.: 1e-3)"})

    def __post_init__(self):
        super().__post_init__()
        if not self.server_lr > 0:
            raise ConfigError(f"algorithm.server_lr: must be > 0, got {self.server_lr}")
        if not 0 <= self.beta1 < 1:
            raise ConfigError(f"algorithm.beta1: must be in [0, 1), got {self.beta1}")
        if not self.tau > 0:
            raise ConfigError(f"algorithm.tau: must be > 0, got {self.tau}")


@dataclass
class FedAdamParams(FedAdagradParams):
    beta2: float = field(default=0.99, metadata={"help": "second-moment decay in [0, 1) (Reddi et al.: 0.99)"})

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.beta2 < 1:
            raise ConfigError(f"algorithm.beta2: must be in [0, 1), got {self.beta2}")


def second_moment(variant: str, v: Tensor, d2: Tensor, beta2: float) -> Tensor:
    """v_t from v_{t-1} and Delta_t^2 (Alg. 2: FedAdagrad's, FedYogi's or FedAdam's update)."""
    if variant == "adagrad":
        return v + d2
    if variant == "yogi":
        return v - (1 - beta2) * d2 * torch.sign(v - d2)
    return beta2 * v + (1 - beta2) * d2


def adaptive_step(variant: str, x: dict[str, Tensor], avg: dict[str, Tensor], m: dict[str, Tensor],
                  v: dict[str, Tensor], lr: float, beta1: float, beta2: float, tau: float):
    """One server step: ``(x_{t+1}, m_t, v_t)`` from the global state ``x``, the round's aggregate
    ``avg`` and the moments ``m``, ``v`` (a name absent from them starts at m = 0, v = tau^2).
    Integer entries of ``avg`` (BatchNorm's counter) pass through and get no moments."""
    new_x, new_m, new_v = {}, {}, {}
    for k, a in avg.items():
        if not torch.is_floating_point(a):
            new_x[k] = a
            continue
        d = a - x[k]                                                    # Delta_t
        new_m[k] = beta1 * m[k] + (1 - beta1) * d if k in m else (1 - beta1) * d        # m_t, m_{-1} = 0
        v0 = v[k] if k in v else torch.full_like(d, tau * tau)
        new_v[k] = second_moment(variant, v0, d * d, beta2)            # v_t, v_{-1} = tau^2
        new_x[k] = x[k] + lr * new_m[k] / (new_v[k].sqrt() + tau)      # x_{t+1}
    return new_x, new_m, new_v


class FedAdaptiveServer(FedAvgServer):
    variant = "adam"
    state_fields = {"m": tensors(), "v": tensors()}  # the moments m_{t-1}, v_{t-1} ({} before round 1)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.m: dict[str, Tensor] = {}
        self.v: dict[str, Tensor] = {}

    def server_step(self, rnd: int, previous: dict[str, Tensor], averaged: dict[str, Tensor]) -> dict[str, Tensor]:
        p = self.params
        x, self.m, self.v = adaptive_step(self.variant, previous, averaged, self.m, self.v, p.server_lr, p.beta1,
                                          getattr(p, "beta2", 0.0), p.tau)
        return x


class FedAdagradServer(FedAdaptiveServer):
    variant = "adagrad"


class FedYogiServer(FedAdaptiveServer):
    variant = "yogi"


class FedAdamServer(FedAdaptiveServer):
    variant = "adam"


register("fedadagrad", FedAdagradParams, FedAdagradServer, FedAvgClient,
         help="FedAdagrad: FedAvg clients, Adagrad on the server's round update (Reddi et al. 2021, Alg. 2)")
register("fedadam", FedAdamParams, FedAdamServer, FedAvgClient,
         help="FedAdam: FedAvg clients, Adam (no bias correction) on the server's round update (Reddi et al. 2021, Alg. 2)")
register("fedyogi", FedAdamParams, FedYogiServer, FedAvgClient,
         help="FedYogi: FedAvg clients, Yogi on the server's round update (Reddi et al. 2021, Alg. 2)")
