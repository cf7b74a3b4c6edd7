"""FedProx (Li et al., 2020): FedAvg whose local objective adds a proximal term

    h_k(w; w^t) = F_k(w) + mu/2 * ||w - w^t||^2        (FedProx, eq. 2)

which keeps local models near the global one. The server is FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgServer
from mmfl.core.training import LossFn, cross_entropy_loss
from mmfl.errors import ConfigError


@dataclass
class FedProxParams:
    mu: float = field(default=0.01, metadata={"help": "proximal weight mu (MOON tunes it in {0.001, 0.01, 0.1, 1})"})

    def __post_init__(self):
        if self.mu < 0:
            raise ConfigError(f"algorithm.mu: must be >= 0, got {self.mu}")


def proximal_term(model: nn.Module, anchor: dict[str, Tensor]) -> Tensor:
    """||w - w^t||^2 over the model's trainable parameters (FedProx eq. 2)."""
    return sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters() if p.requires_grad)


class FedProxClient(FedAvgClient):
    def loss_fn(self, global_arrays: dict[str, Tensor]) -> LossFn:
        mu = self.params.mu
        anchor = {k: v.detach() for k, v in global_arrays.items()}

        def loss(model, inputs, labels):
            base = cross_entropy_loss(model, inputs, labels)
            return base if mu == 0 else base + mu / 2 * proximal_term(model, anchor)

        return loss

    def batched_task(self, route, msg):
        task = super().batched_task(route, msg)
        if task is not None and self.params.mu != 0:
            names = param_names(self.ctx.model("local"))
            task.shared = {"anchor": {n: msg.arrays[n].detach() for n in names}}
        return task

    def batched_penalty(self, params, extras, shared):
        if self.params.mu == 0:
            return None
        anchor = shared["anchor"]  # mu/2 * ||w - w^t||^2, FedProx eq. 2
        return self.params.mu / 2 * sum(((params[n] - a) ** 2).sum() for n, a in anchor.items())


def param_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


register("fedprox", FedProxParams, FedAvgServer, FedProxClient,
         help="FedProx: FedAvg + proximal term mu/2 ||w - w_global||^2 (Li et al. 2020)")
