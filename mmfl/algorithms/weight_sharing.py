"""Weight-sharing baselines of CreamFL's Table 1 (``creamfl_fedavg``, ``creamfl_fediot``):
FedAvg / FedIoT in the paper's homogeneous setting, every client with the server's
architecture, the held encoders and projectors averaged module-wise, the public pairs given
to the image-text clients as extra training pairs. They reuse CreamFL's client (its private
task and public passes) and server (its evaluation), not its representation exchange."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmfl.algorithms.registry import preset, register
from mmfl.algorithms.fedavg import reply_weights, weighted_mean_scalar
from mmfl.algorithms.multimodal import FEDIOT_MULTIMODAL_WEIGHT, only_held
from mmfl.algorithms.base import Server
from mmfl.core.aggregation import aggregate
from mmfl.core.message import Message
from mmfl.core.training import state_of
from mmfl.errors import ConfigError

from mmfl.algorithms.creamfl import CreamFLClient, CreamFLServer
from mmfl.algorithms.creamfl_terms import info_nce


@dataclass
class WeightSharingParams:
    iot: bool = field(default=False, metadata={
        "help": "FedIoT: image-text clients' weights count iot_weight times in the average"})
    iot_weight: float = field(default=FEDIOT_MULTIMODAL_WEIGHT, metadata={
        "help": "iot: weight of image-text clients (100, the CreamFL paper's FedIoT weight)"})
    public_to_multimodal: bool = field(default=True, metadata={
        "help": "give the public pairs to the image-text clients as extra training pairs (the paper's setting)"})
    temperature: float = field(default=0.1, metadata={"help": "InfoNCE temperature of the image-text task"})
    public_size: int = field(default=0, metadata={"help": "use this many public pairs (0 = all)"})
    # not settable: the weight-sharing baselines neither regularize nor distill
    inter = intra = False
    local_distill = "none"
    local_distill_weight = 0.0
    multimodal_loss = "infonce"  # CreamFLClient.loss: the image-text task is InfoNCE here
    server_lr = 0.0  # the server does not train: its model is the average
    server_optimizer = "shared"
    server_lr_schedule = "constant"

    def __post_init__(self):
        if not isinstance(self.iot, bool) or not isinstance(self.public_to_multimodal, bool):
            raise ConfigError("algorithm.iot / public_to_multimodal: expected true or false")
        for key in ("iot_weight", "temperature"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise ConfigError(f"algorithm.{key}: must be a number > 0, got {v!r}")
        if int(self.public_size) < 0:
            raise ConfigError(f"algorithm.public_size: must be >= 0, got {self.public_size!r}")


SHARED = ("encoders.", "proj.")  # what the weight-sharing baselines average; heads etc. stay on the client


class WeightSharingServer(CreamFLServer):
    """FedAvg / FedIoT in CreamFL's homogeneous setting: every client has the server's
    architecture; the held encoders and projectors are averaged module-wise (by sample
    count; FedIoT: image-text clients x ``iot_weight``); the server's model *is* the
    average (it does not train). Heads stay on the clients (their classes differ)."""
    dp_extra_modes = ()  # [dp] not declared for the weight-sharing baselines (not measured)
    runs_on = "pair"

    representation_replies = False
    reply_schema = Server.reply_schema  # model weights: the default schema (mmfl.core.replies)

    def round(self, rnd, cohort, transport):
        full = {k: v for k, v in self.model.state_dict().items() if k.startswith(SHARED)}
        by_holds: dict[tuple, Message] = {}
        msgs = {}
        for cid in cohort:
            holds = self.ctx.modalities_of(cid)
            if holds not in by_holds:
                by_holds[holds] = Message(arrays=only_held(full, holds))
            msgs[cid] = by_holds[holds]
        replies = transport.send("train", msgs)
        if not replies:
            return {"clients_replied": 0}
        cids = sorted(replies)
        weights = [reply_weights(replies[c]) for c in cids]
        states = [replies[c].arrays for c in cids]
        shapes = {}
        for c, st in zip(cids, states):
            for k, t in st.items():
                if shapes.setdefault(k, tuple(t.shape)) != tuple(t.shape):
                    raise ConfigError(f"'{self.params_name()}' averages weights: client {c} sent {k} of shape "
                                      f"{tuple(t.shape)}, another {shapes[k]}; give every client the server's "
                                      "architecture (no [[client_models]])")
        # the rules weighted_mean (FedAvg) / iot (FedIoT: image-text clients' weights x iot_weight)
        multimodal = [set(self.pair) <= set(self.ctx.modalities_of(c)) for c in cids]
        new = aggregate("iot" if self.params.iot else "weighted_mean", states, weights, self.model.state_dict(),
                        multimodal=multimodal, multimodal_weight=self.params.iot_weight)
        self.model.load_state_dict(new)
        out = {"clients_replied": len(replies)}
        for key in ("train_loss", "task_loss"):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                out[key] = v
        return out

    def params_name(self) -> str:
        return "creamfl_fediot" if self.params.iot else "creamfl_fedavg"


class WeightSharingClient(CreamFLClient):
    def load_model(self, msg):
        """The client's own model with the server's averaged encoders and projectors loaded into it."""
        model = super().load_model(msg)
        sd = model.state_dict()
        for k, v in msg.arrays.items():
            if k not in sd or sd[k].shape != v.shape:
                raise ConfigError(f"client {self.ctx.cid}: the server's {k} does not fit this client's model; "
                                  "weight sharing needs every client to have the server's architecture")
            sd[k] = v
        model.load_state_dict(sd)
        return model

    def extra_epoch(self, model, opt, public, gen, stat, pair):
        """The paper's setting: the public pairs are extra training pairs of image-text clients."""
        if not self.params.public_to_multimodal or not set(pair) <= set(self.ctx.modalities):
            return
        self.public_pass(model, opt, public, gen, stat,
                         lambda z, rows: info_nce(z[pair[0]], z[pair[1]], self.params.temperature))

    def reply_arrays(self, model, public, held):
        return {k: v for k, v in state_of(model).items() if k.startswith(SHARED)}


register("creamfl_fedavg", WeightSharingParams,
         WeightSharingServer, WeightSharingClient,
         help="FedAvg in CreamFL's setting: server-size client models, weights averaged, public pairs to "
              "image-text clients")
register("creamfl_fediot",
         preset("CreamFedIoTParams", WeightSharingParams, iot=True),
         WeightSharingServer, WeightSharingClient,
         help="FedIoT in CreamFL's setting: as creamfl_fedavg, image-text clients weigh 100")
