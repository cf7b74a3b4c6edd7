"""FedMSplit: graph-personalized aggregation over a split multimodal model (FedCMI's baseline 3).

FedMSplit (Chen & Zhang, KDD 2022, "Correlation-adaptive federated multi-task
learning across multimodal split networks") splits every client model into
shareable blocks and keeps a *dynamic multi-view graph* on the server: one view
per block type, the clients as nodes, "the underlying correlations between
clients ... captured as the edge features", which are "utilized to promote local
model relations through the neighborhood message passing in the graph"
(the paper's abstract). Each client trains its own (personalized) model.

The paper's full text was not available to us (only its abstract; see
docs/algorithms/fedmsplit.md), so no equation numbers are cited here: every
formula below is this implementation's, and the doc page says which part is the
paper's (stated in its abstract) and which is our choice.

Here the blocks are the modules of :mod:`mmfl.models.multimodal`
(:func:`~mmfl.models.multimodal.module_of`: ``encoders.<m>``, ``proj.<m>``,
``heads.<m>``, ``fusion``, ``classifier``). The server keeps every client's last
uploaded modules ``theta_j^u`` (checkpointed under ``msplit/``). For module ``u``
(one view) over the clients ``N_u`` that uploaded ``u`` (self included):

    edge feature   e^u_ij = cos(theta_i^u, theta_j^u) / tau + b^u_ij           (G1)
    adjacency      A^u_ij = softmax_{j in N_u} e^u_ij                          (G2)
    message        theta~_i^u = (1 - personal_mix) theta_global^u
                                + personal_mix * sum_j A^u_ij theta_j^u         (G3)

``graph = "learned"`` (default): ``b^u`` (one learned logit per directed edge and
view, server state ``msplit_graph/<u>``, checkpointed) is trained on the server by
the gradient of each replying client's local loss at the model it received, with
respect to its edges. The client's pseudo-gradient ``g_i = theta~_i - theta_i'``
(what it sent minus what it returned) is a positive multiple of its loss gradient
at ``theta~_i`` to first order, so

    d f_i / d b^u_ij  ~  personal_mix * A^u_ij * < g_i, theta_j^u - agg_i^u >   (G4)
    b^u_i.  <-  b^u_i. - graph_lr * grad_i / max_j |grad_ij|                    (G5)

(``agg_i^u = sum_j A^u_ij theta_j^u``; (G5) is a normalized gradient step: a
client's largest edge change per round is ``graph_lr``, whatever the gradient's
scale). ``graph = "cosine"``: ``b = 0`` (the fixed cosine attention of earlier
versions; ``fedmsplit_cosine`` also restores their ``personal_mix = 0.5``).

Evaluation is personalized (the ``personalized`` kind of :mod:`mmfl.core.evaluation`):
client ``i``'s model is (G3) for every module it holds (global modules where it
has no graph), tested on rows following its label distribution with only its
modalities: ``accuracy``, ``uar``, ``client_accuracy``, ... The *global* model
(MFedAvg's module-wise data-weighted average of the uploads, which FedCMI's
comparison evaluates) is reported under ``global/`` (``global/accuracy``,
``global/accuracy/<m>``, ...).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.algorithms.registry import preset, register
from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams, MultimodalServer, only_held
from mmfl.core.evaluation import personalized_metrics
from mmfl.core.message import Message
from mmfl.core.state import per_client, tensors
from mmfl.core.training import load_into, model_tensors
from mmfl.errors import ConfigError
from mmfl.models.multimodal import module_of

__all__ = ["FedMSplitParams", "FedMSplitServer", "GRAPH_PREFIX", "GRAPHS", "STATE_PREFIX", "attention_matrix",
           "edge_gradient", "graph_aggregate", "normalized_step"]

STATE_PREFIX = "uploads/"  # server state: "uploads/<cid>/<state-dict key>" = client cid's last upload
GRAPH_PREFIX = "edge_bias/"  # server state: "edge_bias/<module>" = learned edge logits b^u [N, N]
GLOBAL = "global/"  # metric prefix of the global (module-wise average) model's evaluation
GRAPHS = ("learned", "cosine")


def _number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float))


@dataclass
class FedMSplitParams(MFedAvgParams):
    graph: str = field(default="learned", metadata={
        "help": "edge features: 'learned' (cosine start + edge logits trained on the server by the clients' "
                "pseudo-gradients) or 'cosine' (fixed softmax(cos / tau))"})
    tau: float = field(default=0.1, metadata={
        "help": "temperature of the cosine part of the edge features, cos(theta_i, theta_j) / tau"})
    graph_lr: float = field(default=0.5, metadata={
        "help": "server step on the learned edge logits (normalized: a client's largest edge change per round)"})
    personal_mix: float = field(default=1.0, metadata={
        "help": "share of the graph aggregate in a client's personalized module (rest: the global module); "
                "1 = the paper's message passing"})

    def __post_init__(self):
        if self.graph not in GRAPHS:
            raise ConfigError(f"algorithm.graph: must be one of {', '.join(GRAPHS)}, got {self.graph!r}")
        if not _number(self.tau) or not self.tau > 0:
            raise ConfigError(f"algorithm.tau: must be > 0, got {self.tau!r}")
        if not _number(self.graph_lr) or not 0.0 <= self.graph_lr < float("inf"):
            raise ConfigError(f"algorithm.graph_lr: must be a finite number >= 0, got {self.graph_lr!r}")
        if not _number(self.personal_mix) or not 0.0 <= self.personal_mix <= 1.0:
            raise ConfigError(f"algorithm.personal_mix: must be in [0, 1], got {self.personal_mix!r}")


# ----------------------------------------------------------------------------- the graph


def attention_matrix(vectors: Tensor, tau: float, bias: Tensor | None = None) -> Tensor:
    """``A[i, j] = softmax_j(cos(v_i, v_j) / tau + bias[i, j])`` (G1-G2) over the rows of
    ``vectors`` ``[n, d]``, self included; ``bias`` ``[n, n]`` (None: 0). float64 ``[n, n]``."""
    v = F.normalize(vectors.double(), dim=1, eps=1e-12)
    logits = v @ v.T / tau
    if bias is not None:
        logits = logits + bias.double()
    return torch.softmax(logits, dim=1)


def graph_aggregate(states: list[dict[str, Tensor]], weights: Tensor, keys: list[str]) -> dict[str, Tensor]:
    """``sum_j weights[j] * states[j][key]`` for each key (the message of (G3); float64 accumulation, cast back)."""
    out = {}
    for key in keys:
        ref = states[0][key]
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for w, st in zip(weights.tolist(), states):
            acc.add_(st[key].to(torch.float64), alpha=w)
        out[key] = acc.to(ref.dtype)
    return out


def edge_gradient(weights: Tensor, neighbours: Tensor, pseudo_grad: Tensor, mix: float = 1.0) -> Tensor:
    """(G4): ``mix * a_j * <g, theta_j - sum_k a_k theta_k>`` for each neighbour j.

    ``weights`` ``[n]`` (one row of A, summing to 1), ``neighbours`` ``[n, d]`` (the theta_j, flat),
    ``pseudo_grad`` ``[d]`` (g = sent - returned). This is the gradient of ``<g, theta~>`` with
    respect to the row's logits, i.e. (up to the positive factor relating g to the loss gradient)
    of the client's loss at the model it received. float64 ``[n]``."""
    w = weights.double()
    nb = neighbours.double()
    agg = w @ nb
    return float(mix) * w * ((nb - agg) @ pseudo_grad.double())


def normalized_step(row: Tensor, grad: Tensor, lr: float) -> Tensor:
    """(G5): ``row - lr * grad / max|grad|`` (``row`` unchanged where the gradient is all zero)."""
    scale = float(grad.abs().max()) if grad.numel() else 0.0
    if scale == 0.0 or lr == 0.0:
        return row.clone()
    return row - lr * grad.to(row.dtype) / scale


def _flat(arrays: dict[str, Tensor], keys: list[str]) -> Tensor:
    return torch.cat([arrays[k].reshape(-1).double() for k in keys])


# ----------------------------------------------------------------------------- server


class FedMSplitServer(MultimodalServer):
    """MFedAvg's server plus the clients' last modules, the per-module client graph (cosine
    edge features plus learned edge logits), and personalized evaluation."""

    state_fields = {"uploads": per_client(), "edge_bias": tensors()}  # keys: STATE_PREFIX, GRAPH_PREFIX

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.uploads: dict[int, dict[str, Tensor]] = {}  # cid -> its last uploaded tensor per key
        state = dict(self.model.state_dict())
        param_keys = {n for n, _ in self.model.named_parameters()}
        self._modules: dict[str, list[str]] = {}  # module -> its floating state keys (sorted)
        for k in sorted(state):
            if state[k].is_floating_point():
                self._modules.setdefault(module_of(k), []).append(k)
        self._pkeys = {u: [k for k in keys if k in param_keys] for u, keys in self._modules.items()}
        n = ctx.num_clients
        self.edge_bias: dict[str, Tensor] = {}  # module -> b^u [N, N] (G1), learned graph only
        if params.graph == "learned":
            self.edge_bias = {u: torch.zeros(n, n, dtype=torch.float64, device=ctx.device)
                              for u, pk in self._pkeys.items() if pk}
        self._round: dict | None = None  # this round's graphs and what each client was sent (for (G4))
        self._eval_models: dict[tuple, nn.Module] = {}

    # --- the graph ------------------------------------------------------------
    def graph(self, module: str) -> tuple[list[int], Tensor, Tensor] | None:
        """``(clients, A, vectors)``: the clients that uploaded ``module`` (sorted), its adjacency
        (G1-G2) over them and their flattened parameters; None if fewer than two have, or the
        module has no parameters."""
        keys, pkeys = self._modules.get(module, []), self._pkeys.get(module, [])
        if not pkeys:
            return None
        cids = sorted(c for c, st in self.uploads.items() if all(k in st for k in keys))
        if len(cids) < 2:
            return None
        vectors = torch.stack([_flat(self.uploads[c], pkeys) for c in cids])
        bias = None
        if module in self.edge_bias:
            idx = torch.tensor(cids, device=self.edge_bias[module].device)
            bias = self.edge_bias[module][idx][:, idx]
        return cids, attention_matrix(vectors, self.params.tau, bias), vectors

    def personalized(self, cid: int, holds: tuple[str, ...], graphs: dict | None = None,
                     record: dict | None = None) -> dict[str, Tensor]:
        """Client ``cid``'s personalized model (G3): the global modules it holds, each module it
        uploaded before replaced by ``(1 - personal_mix) * global + personal_mix * sum_j A_ij theta_j``.
        ``graphs`` caches :meth:`graph` per module; ``record`` receives ``{module: (cid's row in its
        graph, A_ii)}`` for every module personalized."""
        glob = dict(self.model.state_dict())
        arrays = only_held(glob, holds)
        mix = float(self.params.personal_mix)
        if cid not in self.uploads or mix == 0.0:
            return arrays
        graphs = {} if graphs is None else graphs
        for u in sorted({module_of(k) for k in arrays if module_of(k) in self._modules}):
            if u not in graphs:
                graphs[u] = self.graph(u)
            g = graphs[u]
            if g is None or cid not in g[0]:
                continue  # nobody else has u, or cid never uploaded it: the global module
            cids, a, _ = g
            i = cids.index(cid)
            keys = self._modules[u]
            agg = graph_aggregate([self.uploads[c] for c in cids], a[i], keys)
            for k in keys:
                arrays[k] = agg[k] if mix == 1.0 else \
                    ((1.0 - mix) * glob[k].double() + mix * agg[k].double()).to(glob[k].dtype)
            if record is not None:
                record[u] = (i, float(a[i, i]))
        return arrays

    # --- the round ------------------------------------------------------------
    def configure_train(self, rnd, cohort):
        extra = self.round_arrays(rnd)
        scalars = self.round_scalars(rnd)
        graphs: dict = {}  # one graph per module per round, shared by the cohort
        sent: dict[int, dict] = {}  # cid -> {module: (its row in the graph, the flat parameters it was sent)}
        self_weights: list[float] = []
        out = {}
        for cid in cohort:
            record: dict = {}
            arrays = self.personalized(cid, self.ctx.modalities_of(cid), graphs, record)
            if self.edge_bias:  # what (G4) needs once the replies are in
                sent[cid] = {u: (i, _flat(arrays, self._pkeys[u])) for u, (i, _) in record.items()}
            self_weights += [w for _, w in record.values()]
            out[cid] = Message(arrays={**arrays, **extra}, scalars=dict(scalars))
        self._round = {"graphs": graphs, "sent": sent, "self_weights": self_weights}
        return out

    def learn_graph(self, replies: dict[int, Message]) -> int:
        """(G4-G5) for every replying client and every module it was sent a graph aggregate of;
        returns the number of edge rows updated."""
        if not self.edge_bias or self._round is None or self.params.graph_lr == 0.0:
            return 0
        mix = float(self.params.personal_mix)
        graphs, sent = self._round["graphs"], self._round["sent"]
        updated = 0
        for cid in sorted(replies):
            for u, item in sent.get(cid, {}).items():
                if u not in self.edge_bias:
                    continue
                pkeys = self._pkeys[u]
                if not all(k in replies[cid].arrays for k in pkeys):
                    continue
                i, theta_sent = item
                cids, a, vectors = graphs[u]
                g = theta_sent - _flat(replies[cid].arrays, pkeys)  # pseudo-gradient of client cid
                grad = edge_gradient(a[i], vectors, g, mix)
                idx = torch.tensor(cids, device=self.edge_bias[u].device)
                self.edge_bias[u][cid, idx] = normalized_step(self.edge_bias[u][cid, idx], grad,
                                                              float(self.params.graph_lr))
                updated += 1
        return updated

    def aggregate_train(self, rnd, replies):
        rows = self.learn_graph(replies)  # uses this round's graphs: before the uploads change
        metrics = super().aggregate_train(rnd, replies)  # the global model: module-wise weighted average
        model_keys = set(model_tensors(self.model))
        for cid in sorted(replies):  # a client that did not reply keeps its stored modules
            stored = self.uploads.setdefault(cid, {})
            stored.update({k: v.detach().clone() for k, v in replies[cid].arrays.items() if k in model_keys})
        self_w = self._round["self_weights"] if self._round is not None else []
        if self_w:
            metrics["msplit_self_weight"] = sum(self_w) / len(self_w)
        if self.edge_bias:
            metrics["msplit_graph_rows"] = rows
            metrics["msplit_bias_abs"] = float(torch.stack([b.abs().mean() for b in self.edge_bias.values()]).mean())
        self._round = None
        return metrics

    # --- evaluation -------------------------------------------------------------
    def model_of(self, cid: int, graphs: dict | None = None, personal: bool = True) -> nn.Module:
        """Client ``cid``'s personalized model (G3) (``personal = False``: the global modules it
        holds), loaded into a reusable model per modality set."""
        holds = tuple(self.ctx.modalities_of(cid))
        if holds not in self._eval_models:
            m = copy.deepcopy(self.model)
            if hasattr(m, "keep_only"):
                m.keep_only(holds)
            self._eval_models[holds] = m
        arrays = self.personalized(cid, holds, graphs) if personal else only_held(dict(self.model.state_dict()), holds)
        return load_into(self._eval_models[holds], arrays)

    # the global model under global/; each client's personalized model (mmfl.core.evaluation)
    evaluations = {"personalized": "", "global": GLOBAL}

    def evaluate_personalized(self, ctx):
        """Each client's personalized model on test rows following its label distribution, with
        only its modalities (``accuracy``, ...), and the global model under the same per-client
        evaluation as ``global/personal_accuracy`` / ``global/personal_uar``."""
        graphs: dict = {}  # one graph per module for the whole evaluation
        holds = lambda cid: tuple(self.ctx.modalities_of(cid))  # noqa: E731
        out = personalized_metrics(ctx, lambda cid: self.model_of(cid, graphs),
                                   lambda cid: self.personalized(cid, holds(cid), graphs))
        glob = dict(self.model.state_dict())
        ref = personalized_metrics(ctx, lambda cid: self.model_of(cid, personal=False),
                                   lambda cid: only_held(glob, holds(cid)))
        for k in ("accuracy", "uar"):  # the global model under the same per-client evaluation: the reference
            if k in ref:
                out[f"{GLOBAL}personal_{k}"] = ref[k]
        return out


register("fedmsplit", FedMSplitParams, FedMSplitServer, MFedAvgClient,
         help="FedMSplit: per-module client graph (cosine start + edge logits learned on the server from the "
              "clients' pseudo-gradients) personalizes each client's modules; personalized evaluation "
              "(global model under global/)")
register("fedmsplit_cosine",
         preset("FedMSplitCosineParams", FedMSplitParams, graph="cosine", personal_mix=0.5),
         FedMSplitServer, MFedAvgClient,
         help="FedMSplit as in earlier versions: fixed cosine attention, personal_mix 0.5 (global model "
              "under global/)")
