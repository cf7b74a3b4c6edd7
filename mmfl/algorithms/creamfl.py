"""CreamFL (Yu et al., ICLR 2023): a larger server model learns from heterogeneous
image, text and image-text clients by exchanging representations of a public
paired set; and the baselines of its Tables 1 and 3.

The run's data set is a *pair* data set with two modalities (``emoji_pairs``:
``image`` + ``text``; ``mfeat_pair``: ``image`` + ``features``; ``coco_captions``
and ``flickr30k`` with ``public_images``) with a public split (``Federation.public``). Clients from ``[[client_data]]`` hold one of the
two modalities (image clients on ``fashion_mnist_features`` or ``mnist_pix``,
text clients on ``bbc_news``), each
with a model of its own size (``[[client_models]]``); ``[model]`` is the
server's model. Every model is :mod:`mmfl.models.multimodal`; the
representation of modality ``m`` is the L2-normalised projector output
``normalize(proj[m](encoders[m](x)))`` of size ``d = model.feat_dim``.

One round (Algorithm 1; the order of the authors' ``MMFL.train``):

1. the server trains one epoch on the public pairs (Alg. 1 line 18; the
   authors train with PCME; here the symmetric InfoNCE of CLIP, or PCME with
   ``multimodal_loss = "pcme"``, :mod:`mmfl.algorithms.pcme`);
2. it computes the global representations ``i_global``, ``t_global`` of the
   public set and sends each client what its regularization needs;
3. each client trains ``train.local_epochs`` epochs on its private task:
   image/text clients classification (cross-entropy of ``heads[m]``),
   image-text clients contrastive retrieval (symmetric InfoNCE on their
   pairs, or PCME as the server); after every epoch one pass over the public set adds
   the local contrastive regularization (LCR), eq. 3:
   ``gamma * (l_inter + l_intra)`` with

   - inter-modal (eq. 1): ``CE(i_local @ t_global.T / tau, k)`` -- the
     local representation of public sample k against *all* |P| global
     representations of the other modality, a ``[batch, |P|]`` block at a
     time (never ``|P| x |P|``);
   - intra-modal (eq. 2): ``CE([i_local.i_global, i_local.i_prev] / tau, 0)``
     with ``i_prev`` the client's representation at the start of the round;

4. the client uploads its representations of the public set, only for the
   modalities it holds (``rep/<m>``, ``[|P|, d]`` each);
5. the server aggregates them per modality (``aggregation``):
   ``gca`` = global-local contrastive aggregation, eq. 4-6
   (:mod:`mmfl.algorithms.public_terms`, chunked); ``mean``; ``avg`` (weights
   = the clients' sample counts); ``iot`` (sample counts, image-text clients'
   times ``iot_weight`` = 100, FedIoT's); ``variance`` (FedET); ``entropy`` (FedGEMS);
6. the server distills, eq. 7: ``kd_weight * sum_m MSE(f_m(x^(k)), agg_m^(k))``
   over the public set (the authors' ``kd_weight`` 0.3, MSE).

Registered names (presets of :class:`CreamFLParams`):

- ``creamfl``: GCA + inter + intra (Table 1/3, "CreamFL");
- ``reamfl_mean`` / ``reamfl_avg`` / ``reamfl_iot``: no GCA, no LCR, mean /
  sample-count / FedIoT-weighted representation averaging (Table 3);
- ``fedmd`` / ``fedet`` / ``fedgems``: the public-set KD baselines, presets of these params
  (:mod:`mmfl.algorithms.public_kd`);
- ``creamfl_fedavg`` / ``creamfl_fediot``: the weight-sharing baselines
  (:mod:`mmfl.algorithms.weight_sharing`).

The client is :mod:`mmfl.algorithms.creamfl_client`; the losses, representations and
ensemble weights both sides use are :mod:`mmfl.algorithms.creamfl_terms`.

All switches (``aggregation``, ``inter``, ``intra``, ``local_distill``, ...) can
be combined by hand: Table 3's GCA, GCA+inter and GCA+intra rows are
``creamfl`` with ``inter``/``intra`` switched off.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmfl.algorithms.registry import preset, register
from mmfl.algorithms.base import Server
from mmfl.algorithms.dp_ledger import LEDGER_FIELDS, EpsilonLedger
from mmfl.algorithms.creamfl_client import CreamFLClient
from mmfl.algorithms.creamfl_terms import (CONSENSUS, GLOBAL, REP, masked_mse, pair_loss, pair_modalities, present_of,
                                           public_reps, reps_of,
                                           retrieval_metrics, select_public, target_quality)
from mmfl.algorithms.fedavg import weighted_mean_scalar
from mmfl.algorithms.creamfl_params import AGGREGATIONS, CreamFLParams  # noqa: F401  (the settings)
from mmfl.core import optim
from mmfl.core.aggregation import aggregate, rule_kwargs
from mmfl.core.message import Message
from mmfl.core.replies import ReplySchema
from mmfl.core.state import optimizer, tensors
from mmfl.core.training import cosine_lr, set_lr, shuffled_batches
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed

# ----------------------------------------------------------------------------- server


class CreamFLServer(EpsilonLedger, Server):
    # the public epoch's and the distillation's persistent Adam (saved once when shared), FedMD's consensus;
    # [dp] mode = "sample": each client's epsilon (EpsilonLedger)
    state_fields = {"opt": optimizer(), "opt_kd": optimizer(), "consensus": tensors(), **LEDGER_FIELDS}
    # [dp] mode = "sample": DP-SGD of the private task with batch-level clipping (the image-text clients'
    # InfoNCE takes its negatives from the batch; mmfl.core.dp_rows); the public-set passes are public data
    dp_extra_modes = ("sample",)
    dp_sample_unit = "batch"
    """Server of the representation-exchange family (CreamFL, reamFL, FedMD, FedET, FedGEMS)."""
    runs_on = "public"

    def __init__(self, params: CreamFLParams, ctx):
        super().__init__(params, ctx)
        self.pair = pair_modalities(ctx.meta)
        if ctx.public is None or len(ctx.public) == 0:
            raise ConfigError(f"data: '{ctx.meta.name}' has no public set; CreamFL-style algorithms need "
                              "one (data.public_fraction for emoji_pairs / mfeat_pair, data.public_images for "
                              "coco_captions / flickr30k, split = \"public\" rows in a manifest)")
        missing = [m for m in self.pair if m not in ctx.public.features]
        if missing:
            raise ConfigError(f"data: the public set lacks modality {missing[0]!r}")
        if not all(hasattr(self.model, a) for a in ("encoders", "proj", "heads")):
            raise ConfigError("model.name: CreamFL-style algorithms need model.name = \"multimodal\", "
                              f"got a {type(self.model).__name__}")
        self.public = select_public(ctx.public, params.public_size)
        # Alg. 1's two server phases (public epoch, distillation eq. 7), each with its own persistent,
        # checkpointed Adam state ("per_phase"), or one Adam for both ("shared", the authors' code)
        self.opt = optim.Adam(self.model.parameters(), lr=params.server_lr)
        self.opt_kd = optim.Adam(self.model.parameters(), lr=params.server_lr) \
            if params.server_optimizer == "per_phase" else self.opt
        self.consensus: dict[str, Tensor] = {}

    representation_replies = True  # replies carry representations (the [attack] kinds shuffle_reps, random_reps)

    def reply_schema(self, route: str, cid: int) -> ReplySchema | None:
        """Step 4's reply: ``rep/<m>`` [|P|, d] (the server's dtype) for the paired modalities the
        client holds, and ``num_examples``."""
        if route != "train":
            return None
        shape = (len(self.public), int(self.model.feat_dim))
        dtype = next(self.model.parameters()).dtype
        return ReplySchema({REP + m: (shape, dtype) for m in self.ctx.modalities_of(cid) if m in self.pair})

    # what each client receives
    def needs(self, holds: tuple[str, ...]) -> list[str]:
        """The global representations a client holding ``holds`` needs for its regularization."""
        p = self.params
        need = set()
        for m in holds:
            if m not in self.pair:
                continue
            other = self.pair[1] if m == self.pair[0] else self.pair[0]
            if p.inter:
                need.add(other)
            if p.intra or p.local_distill == "global":
                need.add(m)
        return sorted(need)

    def server_lr(self, rnd: int) -> float:
        """The server's learning rate in round ``rnd``: ``server_lr`` under the paper's cosine schedule
        (T = the run's rounds, to 0) or constant."""
        p = self.params
        if p.server_lr_schedule == "constant" or self.ctx.rounds < 1:
            return p.server_lr
        return cosine_lr(p.server_lr, rnd, self.ctx.rounds)

    def round(self, rnd, cohort, transport):
        p = self.params
        metrics: dict = {"server_lr": self.server_lr(rnd)}
        for opt in (self.opt, self.opt_kd):
            set_lr(opt, metrics["server_lr"])
        if p.server_public_epochs:
            metrics["server_public_loss"] = self.train_public(rnd)
        glob = public_reps(self.model, self.public, self.pair)
        by_holds: dict[tuple, Message] = {}
        msgs = {}
        for cid in cohort:
            holds = self.ctx.modalities_of(cid)
            if holds not in by_holds:  # one message object per modality set, counted per recipient
                arrays = {GLOBAL + m: glob[m] for m in self.needs(holds)}
                if p.local_distill == "consensus":
                    arrays.update({CONSENSUS + m: self.consensus[m] for m in holds if m in self.consensus})
                by_holds[holds] = Message(arrays=arrays)
            msgs[cid] = by_holds[holds]
        replies = transport.send("train", msgs)
        if not replies:
            return {**metrics, "clients_replied": 0}
        agg, info = self.aggregate_reps(replies, glob)
        metrics.update(info)
        metrics.update(target_quality(glob, agg, self.pair, {m: present_of(self.public, m) for m in self.pair}))
        if p.local_distill == "consensus":
            self.consensus = {m: agg[m].clone() for m in agg}
        metrics["distill_loss"] = self.distill(agg, rnd)
        for key in ("train_loss", "task_loss", "lcr_loss"):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                metrics[key] = v
        metrics["clients_replied"] = len(replies)
        if self.ctx.dp is not None:
            for cid in sorted(replies):
                self.note_dpsgd_epsilon(cid, replies[cid])
            metrics.update(self.dpsgd_metrics())
        return metrics

    def aggregation_rule(self) -> str:
        """The rule in :data:`~mmfl.core.aggregation.AGGREGATION_RULES` that ``algorithm.aggregation`` names."""
        return AGGREGATIONS.get(self.params.aggregation, self.params.aggregation)

    def aggregate_reps(self, replies: dict[int, Message], glob: dict[str, Tensor]) -> tuple[dict, dict]:
        """Eq. 4-6 (or the chosen rule) per modality, over the replies carrying it."""
        p = self.params
        rule = self.aggregation_rule()
        cids = sorted(replies)
        updates = [{m: replies[c].arrays[REP + m].float() for m in self.pair if REP + m in replies[c].arrays}
                   for c in cids]
        context = dict(global_reps=glob, pair=self.pair, chunk=p.chunk, exclude_positive=p.exclude_positive,
                       entropy_temperature=p.entropy_temperature, multimodal_weight=float(p.iot_weight))
        public = getattr(self, "public", None)
        has = {} if public is None else {m: k for m in self.pair if (k := present_of(public, m)) is not None}
        if has:  # a public set missing modalities: eq. 4's candidates are the rows holding the other one
            context["public_present"] = has
        if rule in ("rep_iot", "iot"):  # FedIoT: clients holding the whole pair weigh iot_weight times more
            context["multimodal"] = [set(self.pair) <= set(self.ctx.modalities_of(c)) for c in cids]
        weights = [float(replies[c].scalars["num_examples"]) for c in cids]
        rule_info: dict = {}
        context.update(rule_kwargs(rule, p.aggregation_params))
        out = aggregate(rule, updates, weights, info=rule_info, **context)  # eq. 6 with the rule's weights
        agg, info = {}, {}
        for m in self.pair:
            if m not in out:
                continue
            agg[m] = out[m]
            info[f"clients/{m}"] = sum(m in u for u in updates)
            if f"weight_max/{m}" in rule_info:  # 1/C = uniform, 1 = one client per sample
                info[f"weight_max/{m}"] = rule_info[f"weight_max/{m}"]
        return agg, info

    def begin_phase(self, opt: torch.optim.Optimizer) -> None:
        """``restart``: zero Adam's first moment as a server phase begins, so no phase steps along
        the other phase's momentum; the second moment (the gradient scale both losses share) stays."""
        if self.params.server_optimizer == "restart":
            for st in opt.state.values():
                if "exp_avg" in st:
                    st["exp_avg"].zero_()

    def train_public(self, rnd: int) -> float:
        """Alg. 1 line 18: one epoch of the image-text task on the public pairs."""
        a, b = self.pair
        gen = torch.Generator(device="cpu").manual_seed(derive_seed(self.ctx.seed, rnd, "server-public"))
        total, steps = 0.0, 0
        self.begin_phase(self.opt)
        self.model.train()
        for _ in range(self.params.server_public_epochs):
            for inputs, _ in self.public.batches(self.params.server_batch_size, shuffle=True, generator=gen):
                if inputs[a].shape[0] < 2:
                    continue
                z = reps_of(self.model, inputs, self.pair)
                loss = pair_loss(self.model, inputs, z, self.pair, self.params, gen)  # InfoNCE or PCME
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                total, steps = total + loss.detach().double(), steps + 1
        return float(total) / max(steps, 1)

    def distill(self, agg: dict[str, Tensor], rnd: int) -> float:
        """Eq. 7: ``kd_weight * sum_m MSE(f_m(x^(k)), agg_m^(k))`` over the public set."""
        if not agg or not self.params.distill_epochs or not self.params.kd_weight:
            return 0.0
        gen = torch.Generator(device="cpu").manual_seed(derive_seed(self.ctx.seed, rnd, "server-distill"))
        n = len(self.public)
        total, steps = 0.0, 0
        self.begin_phase(self.opt_kd)
        self.model.train()
        if self.params.distill_norm == "eval":  # BatchNorm as in the targets (public_reps: eval mode)
            for mod in self.model.modules():
                if isinstance(mod, torch.nn.modules.batchnorm._NormBase):
                    mod.eval()
        for rows in shuffled_batches(n, self.params.server_batch_size, gen, self.params.distill_epochs):
            inputs, _ = self.public.get(rows)
            z = reps_of(self.model, inputs, list(agg))  # eq. 7 over the public rows holding m
            loss = self.params.kd_weight * sum(masked_mse(z[m], agg[m][rows], present_of(inputs, m)) for m in z)
            self.opt_kd.zero_grad(set_to_none=True)
            loss.backward()
            self.opt_kd.step()
            total, steps = total + loss.detach().double(), steps + 1
        return float(total) / max(steps, 1)

    evaluations = {"retrieval": ""}  # Recall@K of the global model (mmfl.core.evaluation)
    alone = {"name": "creamfl"}  # the server's public epochs alone: the "server only" reference (mmfl.reference)

    def evaluate_retrieval(self, ctx):
        return retrieval_metrics(self.model, ctx.test, self.ctx.meta, self.pair)



# ----------------------------------------------------------------------------- registry


register("creamfl", CreamFLParams, CreamFLServer, CreamFLClient,
         help="CreamFL: representations of a public set, GCA (eq. 4-6), inter/intra LCR (eq. 1-3), distillation (eq. 7)")
register("reamfl_mean",
         preset("ReamFLMeanParams", CreamFLParams, aggregation="mean", inter=False, intra=False),
         CreamFLServer, CreamFLClient, help="reamFL+Mean: CreamFL without GCA and LCR, mean of representations")
register("reamfl_avg",
         preset("ReamFLAvgParams", CreamFLParams, aggregation="avg", inter=False, intra=False),
         CreamFLServer, CreamFLClient, help="reamFL+Avg: CreamFL without GCA and LCR, sample-count weights")
register("reamfl_iot",
         preset("ReamFLIoTParams", CreamFLParams, aggregation="iot", inter=False, intra=False),
         CreamFLServer, CreamFLClient, help="reamFL+IoT: CreamFL without GCA and LCR, image-text clients x 100")
