"""FedProx (Li et al., 2020): FedAvg whose local objective adds a proximal term

    h_k(w; w^t) = F_k(w) + mu/2 * ||w - w^t||^2        (FedProx, eq. 2)

which keeps local models near the global one. The server is FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.errors import ConfigError


@dataclass
class FedProxParams(FedAvgParams):
    mu: float = field(default=0.01, metadata={"help": "proximal weight mu (MOON tunes it in {0.001, 0.01, 0.1, 1})"})

    def __post_init__(self):
        super().__post_init__()
        if self.mu < 0:
            raise ConfigError(f"algorithm.mu: must be >= 0, got {self.mu}")


def proximal_term(params: dict[str, Tensor] | nn.Module, anchor: dict[str, Tensor]) -> Tensor:
    """||w - w^t||^2 = sum over the names of ``params`` of ||params[n] - anchor[n]||^2 (FedProx
    eq. 2): the trainable parameters (each of any shape; a model: its trainable parameters)
    and the received global values of the same names. The sequential and the batched path
    (one client's parameters under vmap) both use it."""
    if isinstance(params, nn.Module):
        params = {n: p for n, p in params.named_parameters() if p.requires_grad}
    return sum(((p - anchor[n].detach()) ** 2).sum() for n, p in params.items())


class FedProxClient(FedAvgClient):
    def penalty(self, params, anchor):
        """mu/2 * ||w - w^t||^2, FedProx eq. 2 (None for mu = 0: plain FedAvg)."""
        return None if self.params.mu == 0 else self.params.mu / 2 * proximal_term(params, anchor)


register("fedprox", FedProxParams, FedAvgServer, FedProxClient,
         help="FedProx: FedAvg + proximal term mu/2 ||w - w_global||^2 (Li et al. 2020)")
