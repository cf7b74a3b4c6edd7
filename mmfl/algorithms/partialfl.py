"""PartialFL ("Partial Federated Learning", paper ``003``; no public code): one modality may
leave the device, the other and all labels may not.

The data set has a **shareable** modality S (``shareable``: text, or an image of the
same digit) and a **private** one P (speech, a photo). Three models (section 2, App. C):

- **F_s**, the server model on S: ``encoders[S]`` + ``proj[S]`` of a second copy of
  ``[model]`` kept on the server. Each client uploads its S data once (Alg. 1 line 4;
  S is shareable, so it may leave; with frozen-encoder data sets it is the frozen
  embedding, e.g. MiniLM of the emoji name). The server computes z_T = F_s(X_T^k)
  (lines 8, 25) and trains F_s with the embedding alignment L^{L->S} (eq. 2) against
  the clients' local embeddings z'_T (line 22, ``ServerTrain``).
- **F_g**, the global model: ``[model]`` on P only (``global_model = "private"``: the
  fusion's S slot stays empty) or on P and S (``"both"``: the multimodal embedding z_M is
  the fusion output). Clients train it with CE + beta * L^{T->A} (eq. 3; eq. 1: z_A of the
  sample against the server's z_T of the same sample, the batch's other z_A as
  negatives); the server averages it (FedAvg, line 28; FedProx with ``mu``).
- **F_k**, each client's local model on S: ``encoders[S]`` + ``proj[S]`` + ``heads[S]``,
  CE + beta * L^{S->L} (eq. 4), kept in the client's state and never uploaded; only
  its embeddings z'_T of the client's S data go up (line 17-18).

Alternating minimization (section 2.5): per round the clients train with the server's
z_T fixed, then the server trains F_s with the clients' z'_T fixed.

Registered:

- ``partialfl``: the above, F_g aggregated by FedAvg;
- ``partialfl_prox``: F_g with FedProx's proximal term (mu = 0.01, the paper's);
- ``pfl_fedavg`` / ``pfl_fedprox``: the FL baselines, F_g alone (no server model, no
  local model, no alignment, nothing of S leaves the device);
- ``pfl_centralized``: F_g trained on all clients' data pooled (the upper bound).

Clients without S (``[modalities]``, the paper's Table 3) train F_g with CE only and
upload nothing of S.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from contextlib import nullcontext
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.algorithms.registry import preset, register
from mmfl.algorithms.base import Client, Server
from mmfl.algorithms.fedavg import weighted_mean_scalar
from mmfl.algorithms.creamfl_terms import present_of
from mmfl.algorithms.partialfl_terms import (LOCAL, X, ZPRIME, ZT, anchored_contrastive,  # noqa: F401
                                           branch_embed, global_keys, require_model, shareable_of)
from mmfl.algorithms.dp_ledger import (LEDGER_FIELDS, EpsilonLedger, count_releases, release_model, release_rows,
                                       rows_dp, with_epsilon)
from mmfl.algorithms.multimodal import masked_ce
from mmfl.core import optim
from mmfl.core.aggregation import aggregate
from mmfl.core.dp_rows import fixed_batchnorm
from mmfl.core.message import Message
from mmfl.core.replies import ReplySchema
from mmfl.core.state import module, optimizer, per_client, read, scalar, tensor, write
from mmfl.core.training import evaluate_model, load_into, make_optimizer, shuffled_batches, state_of
from mmfl.data.base import LENGTH, PRESENT, is_modality
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed

@dataclass
class PartialFLParams:
    shareable: str = field(default="", metadata={
        "help": "the modality that may leave the device (as data / frozen embeddings); the other is private. "
                "Empty: the data set's modality named 'text', else the second in sorted order"})
    global_model: Literal["private", "both"] = field(default="private", metadata={
        "help": "F_g on the private modality only, or on both (multimodal; needs model.fusion sum/film/gated)"})
    align: bool = field(default=True, metadata={
        "help": "PartialFL's server model, local models and alignment losses (false: plain FedAvg/FedProx)"})
    beta: float = field(default=0.01, metadata={"help": "weight of the alignment losses (eq. 3-4; paper 1e-3, 1e-2)"})
    tau: float = field(default=0.1, metadata={"help": "temperature of eq. 1, 2, 4 (paper: 0.05, 0.1, 0.2)"})
    mu: float = field(default=0.0, metadata={"help": "FedProx proximal weight on F_g (paper: 0.01; 0 = FedAvg)"})
    server_lr: float = field(default=1e-3, metadata={"help": "Adam learning rate of the server model F_s"})
    server_epochs: int = field(default=1, metadata={"help": "epochs of F_s over each client's data per round"})
    server_batch_size: int = field(default=64, metadata={"help": "batch size of the server's F_s training"})

    def __post_init__(self):
        if self.global_model not in ("private", "both"):
            raise ConfigError(f"algorithm.global_model: must be 'private' or 'both', got {self.global_model!r}")
        for key in ("beta", "mu", "server_lr"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ConfigError(f"algorithm.{key}: must be a number >= 0, got {v!r}")
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not self.tau > 0:
            raise ConfigError(f"algorithm.tau: must be a number > 0, got {self.tau!r}")
        if not isinstance(self.align, bool):
            raise ConfigError(f"algorithm.align: expected true or false, got {self.align!r}")
        for key in ("server_epochs", "server_batch_size"):
            if isinstance(getattr(self, key), bool) or int(getattr(self, key)) < 1:
                raise ConfigError(f"algorithm.{key}: must be >= 1, got {getattr(self, key)!r}")


# ----------------------------------------------------------------------------- server


class PartialFLServer(EpsilonLedger, Server):
    trains_modality_heads = True  # F_g's probes (PartialFLClient.train)
    runs_on = "shareable"
    # F_s and its Adam state (align only; None otherwise), the uploaded shareable data, [dp]'s epsilons
    state_fields = {"fs": module(), "fs_opt": optimizer(), "xs": per_client(tensor()), "uploaded": scalar(),
                    **LEDGER_FIELDS}
    # [dp] mode = "rows": x/S and z'_T through the per-row Gaussian mechanism, F_g's update through local DP's
    # randomizer (mmfl.algorithms.dp_ledger); each client accounts its releases and sends its epsilon
    dp_extra_modes = ("rows",)

    def extra_reply_arrays(self) -> ReplySchema:
        """A reply also carries ``zprime``, the local embeddings of the client's rows ([rows, d])."""
        return ReplySchema(free=(ZPRIME,))

    def __init__(self, params: PartialFLParams, ctx):
        super().__init__(params, ctx)
        self.s, self.p = shareable_of(ctx.meta, params.shareable)
        require_model(self.model, params.global_model)
        lacking = [c for c in range(ctx.num_clients) if self.p not in ctx.modalities_of(c)]
        if lacking:
            raise ConfigError(f"modalities: client {lacking[0]} lacks the private modality {self.p!r}, which "
                              "PartialFL's global model needs; only the shareable one may be missing")
        self.fs = ctx.make_model() if params.align else None  # F_s: its encoders[S] + proj[S]
        self.fs_opt = optim.Adam(self.fs.parameters(), lr=params.server_lr) if self.fs is not None else None
        self.xs: dict[int, Tensor] = {}  # the shareable data each client uploaded once
        self.lens: dict[int, Tensor] = {}  # and its valid lengths, where S is a padded sequence
        self.uploaded = False

    def collect_shareable(self, transport) -> None:
        """Alg. 1 lines 2-5: every client holding S uploads X_T^k once."""
        holders = [c for c in range(transport.num_clients) if self.s in self.ctx.modalities_of(c)]
        replies = transport.send("upload", {c: Message() for c in holders})
        self.xs.update({c: r.arrays[X + self.s] for c, r in replies.items() if X + self.s in r.arrays})
        self.lens.update({c: r.arrays[X + LENGTH + self.s] for c, r in replies.items()
                          if X + LENGTH + self.s in r.arrays})
        self.uploaded = True

    @torch.no_grad()
    def server_embeddings(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        self.fs.eval()
        out = torch.cat([F.normalize(branch_embed(self.fs, self.s, x[i:i + 1024],
                                                  None if lengths is None else lengths[i:i + 1024]), dim=-1)
                         for i in range(0, x.shape[0], 1024)])
        self.fs.train()
        return out

    def round(self, rnd, cohort, transport):
        p = self.params
        metrics: dict = {}
        if p.align and not self.uploaded:
            self.collect_shareable(transport)
        full = self.model.state_dict()
        msgs = {}
        for cid in cohort:
            holds = self.ctx.modalities_of(cid)
            arrays = {k: full[k] for k in global_keys(self.model, self.p, p.global_model, holds)}
            if p.align and cid in self.xs:
                arrays[ZT] = self.server_embeddings(self.xs[cid], self.lens.get(cid))  # lines 8/25, sampled clients
            msgs[cid] = Message(arrays=arrays)
        replies = transport.send("train", msgs)
        if not replies:
            return {"clients_replied": 0}
        if p.align:  # step 4.1: F_s against each client's z'_T (eq. 2), the clients' side fixed
            losses = [self.train_server(self.xs[c], replies[c].arrays[ZPRIME], rnd, c, self.lens.get(c))
                      for c in sorted(replies) if ZPRIME in replies[c].arrays and c in self.xs]
            if losses:
                metrics["server_align_loss"] = float(np.mean(losses))
        states = [{k: v for k, v in replies[c].arrays.items() if k in full} for c in sorted(replies)]
        weights = [float(replies[c].scalars["num_examples"]) for c in sorted(replies)]
        self.model.load_state_dict(aggregate("weighted_mean", states, weights, full))  # step 4.2 (FedAvg's rule)
        for key in ("train_loss", "global_loss", "local_loss", "align_loss"):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                metrics[key] = v
        metrics["clients_replied"] = len(replies)
        if self.ctx.dp is not None:
            for cid in sorted(replies):
                self.note_dpsgd_epsilon(cid, replies[cid])
            metrics.update(self.dpsgd_metrics())
        return metrics

    def train_server(self, x: Tensor, zprime: Tensor, rnd: int, cid: int, lengths: Tensor | None = None) -> float:
        """ServerTrain (Alg. 1 line 40): L^{L->S} (eq. 2), anchor z_T = F_s(X_T), positive z'_T."""

        gen = torch.Generator(device="cpu").manual_seed(derive_seed(self.ctx.seed, rnd, "server-train", cid))
        total, steps = 0.0, 0
        bs = self.params.server_batch_size
        for rows in shuffled_batches(x.shape[0], bs, gen, self.params.server_epochs):
            zt = F.normalize(branch_embed(self.fs, self.s, x[rows], None if lengths is None else lengths[rows]), dim=-1)
            loss = anchored_contrastive(zt, zprime[rows], self.params.tau)
            self.fs_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.fs_opt.step()
            total, steps = total + loss.detach().double(), steps + 1
        return float(total) / max(steps, 1)

    def test_view(self, test):
        keep = [self.p] + [PRESENT + self.p] * (PRESENT + self.p in test.features)  # its mask goes with it
        return test.with_features(keep) if self.params.global_model == "private" else test

    def evaluate_global(self, ctx):
        return evaluate_model(self.model, self.test_view(ctx.test), num_classes=self.ctx.meta.num_classes)


# ----------------------------------------------------------------------------- client


class PartialFLClient(Client):
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def _modalities(self) -> tuple[str, str]:
        return shareable_of(self.ctx.meta, self.params.shareable)

    def upload(self, msg: Message) -> Message:
        """Alg. 1 line 4: the shareable modality's data, rows in the client's order; no labels."""
        s, _ = self._modalities()
        feats, _ = self.ctx.data.get()
        has = feats.get(PRESENT + s)  # rows lacking S are not sent: the server's z_T, z'_T cover the others
        pick = (lambda t: t) if has is None else (lambda t: t[has.to(torch.bool).reshape(-1)])
        arrays = {X + s: pick(feats[s]).contiguous()}
        if rows_dp(self.ctx) is not None:  # [dp] mode = "rows": each row clipped and noised (once)
            if not arrays[X + s].is_floating_point():
                raise ConfigError(f"dp.mode: \"rows\" noises each row's vector, but the shareable modality {s!r} "
                                  f"is {arrays[X + s].dtype} (token ids); use a frozen-embedding data set or no [dp]")
            arrays[X + s] = release_rows(self.ctx, arrays[X + s], "upload")
            return with_epsilon(Message(arrays=arrays), count_releases(self.ctx, 1))
        if LENGTH + s in feats:  # a padded sequence: its valid lengths go with it
            arrays[X + LENGTH + s] = pick(feats[LENGTH + s]).contiguous()
        return Message(arrays=arrays)

    def train(self, msg: Message) -> Message:
        p, ctx = self.params, self.ctx
        s, priv = self._modalities()
        has_s = s in ctx.modalities and ZT in msg.arrays and p.align
        gmodel = ctx.model("global")
        keys = [k for k in msg.arrays if k != ZT]
        sd = dict(state_of(gmodel))
        sd.update({k: msg.arrays[k] for k in keys})
        load_into(gmodel, sd)
        anchor = {k: msg.arrays[k].detach().clone() for k in keys} if p.mu > 0 else None
        gparams = [q for name, q in gmodel.named_parameters() if name in set(keys)]
        gopt = make_optimizer(gparams, ctx.train)
        lmodel = lopt = None
        if has_s:
            lmodel = ctx.model("local")
            own = read(ctx.state, LOCAL)
            sd = dict(state_of(lmodel))  # only the S branch is F_k; the rest of the instance is unused
            sd.update(own if own else ctx.init_model().state_dict())
            load_into(lmodel, sd)
            lparams = [q for name, q in lmodel.named_parameters() if name.split(".")[:2] in
                       (["encoders", s], ["proj", s], ["heads", s])]
            lopt = make_optimizer(lparams, ctx.train)
        zt = msg.arrays.get(ZT)
        s_rows = present_of(ctx.data, s) if s in ctx.modalities else None  # the rows holding S (None: all)
        if zt is not None and s_rows is not None:  # z_T came for those rows only: zeros at the others
            zt = zt.new_zeros(len(ctx.data), zt.shape[1]).index_copy(0, s_rows.nonzero().squeeze(1).to(zt.device), zt)
        view = [priv] if p.global_model == "private" else [m for m in ctx.modalities]
        gen = ctx.generator()
        n = len(ctx.data)
        stats = {"global": [0.0, 0], "local": [0.0, 0], "align": [0.0, 0]}
        gmodel.train()
        if lmodel is not None:
            lmodel.train()
        frozen = fixed_batchnorm(gmodel) if rows_dp(ctx) is not None else nullcontext()
        frozen.__enter__()  # [dp] mode = "rows": F_g's BatchNorm statistics stay as received (released as they came)
        for rows in shuffled_batches(n, ctx.train.batch_size, gen, ctx.train.local_epochs):
            inputs, labels = ctx.data.get(rows)
            # eq. 3: F_g, CE + beta * L^{T->A} (eq. 1) against the server's z_T
            out = gmodel({m: inputs[m] for m in view if m in inputs} | {
                k: v for k, v in inputs.items() if not is_modality(k)})  # present/ masks, length/ lengths
            loss_g = masked_ce(out["logits"], labels, out["any_present"])  # rows holding no modality: none
            for m, z in out["mod_reps"].items():  # per-modality heads as linear probes on detached
                loss_g = loss_g + masked_ce(gmodel.heads[m](z.detach()), labels, out["present"][m])  # (accuracy/<m>)
            if has_s and p.beta:
                za = out["mod_reps"][priv] if p.global_model == "private" else out["rep"]
                ok = out["present"][priv] if p.global_model == "private" else out["any_present"]
                if s_rows is not None:  # eq. 1's pairs: the anchor's and z_T's rows both present
                    ok = s_rows.to(za.device)[rows] if ok is None else ok & s_rows.to(za.device)[rows]
                al = anchored_contrastive(F.normalize(za, dim=-1), zt[rows], p.tau, ok)
                loss_g = loss_g + p.beta * al
                stats["align"][0] += al.detach().double()
                stats["align"][1] += 1
            if anchor is not None:  # FedProx: mu/2 ||theta_g - theta_g^t||^2
                own = dict(gmodel.named_parameters())
                loss_g = loss_g + p.mu / 2 * sum(((own[k] - anchor[k]) ** 2).sum() for k in anchor if k in own)
            gopt.zero_grad(set_to_none=True)
            loss_g.backward()
            gopt.step()
            stats["global"][0] += loss_g.detach().double()  # summed on the device: no sync per step
            stats["global"][1] += 1
            if lmodel is not None:  # eq. 4: F_k, CE + beta * L^{S->L} against z_T
                z = lmodel.encode_present(s, inputs, lmodel.proj[s])  # rows lacking S: not encoded, no term
                sel = present_of(inputs, s)
                loss_l = masked_ce(lmodel.heads[s](z), labels, sel)
                if p.beta:
                    loss_l = loss_l + p.beta * anchored_contrastive(F.normalize(z, dim=-1), zt[rows], p.tau, sel)
                lopt.zero_grad(set_to_none=True)
                loss_l.backward()
                lopt.step()
                stats["local"][0] += loss_l.detach().double()
                stats["local"][1] += 1
        frozen.__exit__(None, None, None)
        own = state_of(gmodel)
        arrays = {k: own[k] for k in keys}
        mean = {k: float(v[0]) / max(v[1], 1) for k, v in stats.items()}
        scalars = {"num_examples": n, "train_loss": mean["global"], "global_loss": mean["global"]}
        if lmodel is not None:
            write(ctx.state, LOCAL, {k: v for k, v in state_of(lmodel).items()
                                     if k.split(".")[:2] in (["encoders", s], ["proj", s], ["heads", s])})
            lmodel.eval()
            with torch.no_grad():  # line 17: z'_T of all the client's S data
                feats, _ = ctx.data.get()
                zp = F.normalize(lmodel.encode_present(s, feats, lmodel.proj[s]), dim=-1)
                arrays[ZPRIME] = zp if s_rows is None else zp[s_rows.to(zp.device)]  # the rows uploaded
            scalars["local_loss"] = mean["local"]
            if stats["align"][1]:
                scalars["align_loss"] = mean["align"]
        if rows_dp(ctx) is not None:  # [dp] mode = "rows": F_g's update (local DP) and each z'_T row
            arrays.update(release_model(ctx, {k: arrays[k] for k in keys}, {k: msg.arrays[k] for k in keys}, "model",
                                        {n for n, _ in gmodel.named_parameters()}))
            if ZPRIME in arrays:
                arrays[ZPRIME] = release_rows(ctx, arrays[ZPRIME], ZPRIME)
            return with_epsilon(Message(arrays=arrays, scalars=scalars), count_releases(ctx, 1 + (ZPRIME in arrays)))
        return Message(arrays=arrays, scalars=scalars)


# ----------------------------------------------------------------------------- registry


register("partialfl", PartialFLParams, PartialFLServer, PartialFLClient,
         help="PartialFL: shareable modality to a server model, private one and labels stay; contrastive "
              "alignment of the server, global and local model (eq. 1-4); F_g by FedAvg")
register("partialfl_prox",
         preset("PartialFLProxParams", PartialFLParams, mu=0.01), PartialFLServer, PartialFLClient,
         help="PartialFL with F_g aggregated by FedProx (mu 0.01)")
register("pfl_fedavg",
         preset("PflFedAvgParams", PartialFLParams, align=False), PartialFLServer, PartialFLClient,
         help="PartialFL's FedAvg baseline: F_g alone (private modality, or both), nothing of S leaves")
register("pfl_fedprox",
         preset("PflFedProxParams", PartialFLParams, align=False, mu=0.01), PartialFLServer, PartialFLClient,
         help="PartialFL's FedProx baseline (mu 0.01)")
register("pfl_centralized",
         preset("PflCentralizedParams", PartialFLParams, align=False), PartialFLServer, PartialFLClient,
         pooled=True, help="PartialFL's centralized upper bound: F_g on all clients' data pooled")
