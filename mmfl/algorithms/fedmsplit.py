"""FedMSplit: graph-personalized aggregation over a split multimodal model (FedCMI's baseline 3).

FedMSplit (Chen & Zhang, KDD 2022, "Correlation-adaptive federated multi-task
learning across multimodal split networks") splits every client model into
shareable blocks and keeps a *dynamic multi-view graph* on the server: one view
per block type, the clients as nodes, edge weights from the correlation of the
clients' blocks. A client's model for the next round is a message-passing
aggregate of its neighbours' blocks in each view.

Here the blocks are the modules of :mod:`mmfl.models.multimodal`
(:func:`~mmfl.models.multimodal.module_of`: ``encoders.<m>``, ``proj.<m>``,
``heads.<m>``, ``fusion``, ``classifier``). The server keeps every client's last
uploaded modules ``theta_j^u`` (server state, checkpointed under ``msplit/``).
For module ``u``, the graph view over the clients ``N_u`` that uploaded ``u`` is

    A^u_ij = softmax_{j in N_u} ( cos(theta_i^u, theta_j^u) / tau )     (i included)

This cosine-similarity attention replaces the paper's learned graph (an attention
over client module embeddings), see docs/algorithms/fedmsplit.md. A sampled client ``i``
receives, for every module ``u`` it holds,

    theta~_i^u = (1 - personal_mix) * theta_global^u + personal_mix * sum_j A^u_ij theta_j^u

or ``theta_global^u`` if ``i`` has not uploaded ``u`` yet or no other client has.
Clients train as in MFedAvg. The *global* model (the one the server evaluates, as
in FedCMI's comparison) is MFedAvg's module-wise data-weighted average of the uploads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.algorithms import register
from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams, MultimodalServer, only_held
from mmfl.engine.message import Message
from mmfl.engine.training import model_tensors
from mmfl.errors import ConfigError
from mmfl.models.multimodal import module_of

__all__ = ["FedMSplitParams", "FedMSplitServer", "STATE_PREFIX", "attention_matrix", "graph_aggregate"]

STATE_PREFIX = "msplit/"  # server state: "msplit/<cid>/<state-dict key>" = client cid's last upload


@dataclass
class FedMSplitParams(MFedAvgParams):
    tau: float = field(default=0.1, metadata={
        "help": "temperature of the graph attention softmax(cos(theta_i, theta_j) / tau)"})
    personal_mix: float = field(default=0.5, metadata={
        "help": "share of the graph-aggregated module in a client's personalized module (rest: global)"})

    def __post_init__(self):
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not self.tau > 0:
            raise ConfigError(f"algorithm.tau: must be > 0, got {self.tau!r}")
        if isinstance(self.personal_mix, bool) or not isinstance(self.personal_mix, (int, float)) \
                or not 0.0 <= self.personal_mix <= 1.0:
            raise ConfigError(f"algorithm.personal_mix: must be in [0, 1], got {self.personal_mix!r}")


# ----------------------------------------------------------------------------- the graph


def attention_matrix(vectors: Tensor, tau: float) -> Tensor:
    """``A[i, j] = softmax_j(cos(v_i, v_j) / tau)`` over the rows of ``vectors`` ``[n, d]``, self included."""
    v = F.normalize(vectors.double(), dim=1, eps=1e-12)
    return torch.softmax(v @ v.T / tau, dim=1)


def graph_aggregate(states: list[dict[str, Tensor]], weights: Tensor, keys: list[str]) -> dict[str, Tensor]:
    """``sum_j weights[j] * states[j][key]`` for each key (float64 accumulation, cast back)."""
    out = {}
    for key in keys:
        ref = states[0][key]
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for w, st in zip(weights.tolist(), states):
            acc.add_(st[key].to(torch.float64), alpha=w)
        out[key] = acc.to(ref.dtype)
    return out


# ----------------------------------------------------------------------------- server


class FedMSplitServer(MultimodalServer):
    """MFedAvg's server plus the clients' last modules and the per-module attention graph."""

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.uploads: dict[int, dict[str, Tensor]] = {}  # cid -> its last uploaded tensor per key
        state = dict(self.model.state_dict())
        self._param_keys = {n for n, _ in self.model.named_parameters()}
        self._modules: dict[str, list[str]] = {}  # module -> its floating state keys (sorted)
        for k in sorted(state):
            if state[k].is_floating_point():
                self._modules.setdefault(module_of(k), []).append(k)
        self._self_weights: list[float] = []

    # --- the graph ------------------------------------------------------------
    def graph(self, module: str) -> tuple[list[int], Tensor] | None:
        """``(clients, A)``: the clients that uploaded ``module`` (sorted) and its attention
        matrix over them; None if fewer than two have, or the module has no parameters."""
        keys = self._modules.get(module, [])
        pkeys = [k for k in keys if k in self._param_keys]
        if not pkeys:
            return None
        cids = sorted(c for c, st in self.uploads.items() if all(k in st for k in keys))
        if len(cids) < 2:
            return None
        vectors = torch.stack([torch.cat([self.uploads[c][k].reshape(-1).double() for k in pkeys]) for c in cids])
        return cids, attention_matrix(vectors, self.params.tau)

    def personalized(self, cid: int, holds: tuple[str, ...], graphs: dict | None = None) -> dict[str, Tensor]:
        """What client ``cid`` receives: the global modules it holds, each module it uploaded before
        blended with its graph aggregate ``(1 - personal_mix) * global + personal_mix * sum_j A_ij theta_j``."""
        glob = dict(self.model.state_dict())
        arrays = only_held(glob, holds)
        mix = float(self.params.personal_mix)
        own = self.uploads.get(cid)
        if own is None or mix == 0.0:
            return arrays
        graphs = {} if graphs is None else graphs
        held_modules = sorted({module_of(k) for k in arrays if module_of(k) in self._modules})
        for u in held_modules:
            if u not in graphs:
                graphs[u] = self.graph(u)
            g = graphs[u]
            if g is None or cid not in g[0]:
                continue  # nobody else has u, or cid never uploaded it: the global module
            cids, a = g
            i = cids.index(cid)
            keys = self._modules[u]
            agg = graph_aggregate([self.uploads[c] for c in cids], a[i], keys)
            for k in keys:
                arrays[k] = ((1.0 - mix) * glob[k].double() + mix * agg[k].double()).to(glob[k].dtype)
            self._self_weights.append(float(a[i, i]))
        return arrays

    # --- the round ------------------------------------------------------------
    def configure_train(self, rnd, cohort):
        extra = self.round_arrays(rnd)
        scalars = self.round_scalars(rnd)
        graphs: dict = {}  # one graph per module per round, shared by the cohort
        self._self_weights = []
        return {cid: Message(arrays={**self.personalized(cid, self.ctx.modalities_of(cid), graphs), **extra},
                             scalars=dict(scalars))
                for cid in cohort}

    def aggregate_train(self, rnd, replies):
        metrics = super().aggregate_train(rnd, replies)  # the global model: module-wise weighted average
        model_keys = set(model_tensors(self.model))
        for cid in sorted(replies):  # a client that did not reply keeps its stored modules
            stored = self.uploads.setdefault(cid, {})
            stored.update({k: v.detach().clone() for k, v in replies[cid].arrays.items() if k in model_keys})
        if self._self_weights:
            metrics["msplit_self_weight"] = sum(self._self_weights) / len(self._self_weights)
        return metrics

    # --- checkpointing ----------------------------------------------------------
    def state_dict(self):
        sd = super().state_dict()
        for cid in sorted(self.uploads):
            for k, v in self.uploads[cid].items():
                sd[f"{STATE_PREFIX}{cid}/{k}"] = v
        return sd

    def load_state_dict(self, sd):
        super().load_state_dict(sd)
        self.uploads = {}
        for name, v in sd.items():
            if name.startswith(STATE_PREFIX):
                cid, key = name[len(STATE_PREFIX):].split("/", 1)
                self.uploads.setdefault(int(cid), {})[key] = v.clone()


register("fedmsplit", FedMSplitParams, FedMSplitServer, MFedAvgClient,
         help="FedMSplit: per-module cosine-attention client graph personalizes each client's modules "
              "(Chen & Zhang 2022); the global model is the module-wise average")
