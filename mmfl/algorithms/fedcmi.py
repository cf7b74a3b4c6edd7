"""FedCMI (Fan et al., "Balanced Multi-modal Federated Learning via Cross-Modal Infiltration", 2023).

The model (``model.name = "multimodal"``, ``two_projector = true``) gives each
modality m an encoder psi^m, a self projector SP (``proj[m]``), an infiltration
projector IP (``infil[m]``) and a classifier shared by the two (``heads[m]``);
the SP outputs are fused for the joint classifier.

A multimodal client minimises (eq. 7)

    L = L_ce + L_ce^{m0} + L_ce^{m1} + kappa * L_rd + mu * L_prox

- ``L_ce``: cross-entropy of the joint output; ``L_ce^m``: of ``heads[m](SP_m)``
  (the two-projector module's "self-enhancement", section 3.2);
- discrepancy ratio (eq. 3-4): s_k^m = softmax(y_hat^SP_m)[y_k],
  rho = sum_B s^{m0} / sum_B s^{m1}: m0 dominates the batch if rho > 1;
- ``L_rd`` (eq. 5): KL(p^SP_{dominant, global} || p^IP_{weak}), the *global*
  model's dominant branch (a frozen copy of the model received this round)
  teaching the local weak branch's infiltration projector;
- class-wise temperature (eq. 8-10): per class c, rho_c = sum_{y=c} s^{dom} /
  sum_{y=c} s^{weak} over the client's data, rho = mean_c rho_c; the weak
  (student) side uses T_c = T / (1 + beta log(rho_c / rho)) where rho_c > rho, else T;
- ``L_prox`` (eq. 6): mu/2 ||phi_b - phi_b^t||^2 over the base modules (all but IP).

A unimodal client trains the joint output only (the IP output of its modality
fills the missing slot; section 3.2, discussion (3)). Base modules are uploaded
and averaged module-wise; the infiltration projectors stay on the client (never
uploaded). Each component can be switched off for the ablation (Table 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.fedavg import DPSGD_HISTORY, MODULE_WEIGHT
from mmfl.algorithms.multimodal import MultimodalClient, MultimodalServer, masked_ce, proximal
from mmfl.core.dp_rows import batch_dpsgd_train
from mmfl.core.dpsgd import history_epsilon, record_steps
from mmfl.core.state import read, tensor, write
from mmfl.core.training import load_into, model_tensors
from mmfl.seeds import derive_seed
from mmfl.errors import ConfigError

INFIL = "infil."


@dataclass
class FedCMIParams:
    kappa: float = field(default=1.0, metadata={"help": "weight of the distillation loss L_rd (eq. 7; paper: 1-3)"})
    mu: float = field(default=1.0, metadata={"help": "proximal weight on the base modules (eq. 6-7; 0 = off)"})
    temperature: float = field(default=1.0, metadata={"help": "distillation temperature T (eq. 5, 10)"})
    beta: float = field(default=2.0, metadata={"help": "class-wise temperature strength beta (eq. 9)"})
    uni_ce: bool = field(default=True, metadata={
        "help": "per-modality cross-entropy L_ce^m on the self projectors (the two-projector module, TP)"})
    distill: bool = field(default=True, metadata={"help": "distillation from the global dominant modality (RD)"})
    class_temperature: bool = field(default=True, metadata={"help": "class-wise temperature adaptation (CTA)"})
    projector: Literal["two", "uni"] = field(default="two", metadata={
        "help": "two: distil into the infiltration projector (FedCMI); uni: into the self projector (ablation UP)"})
    cta_from_round: int = field(default=1, metadata={
        "help": "first round (0-based) using class-wise temperatures (the authors' code: from round 1)"})

    def __post_init__(self):
        for name in ("kappa", "mu", "beta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"algorithm.{name}: must be >= 0, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ConfigError(f"algorithm.temperature: must be > 0, got {self.temperature}")
        if self.cta_from_round < 0:
            raise ConfigError(f"algorithm.cta_from_round: must be >= 0, got {self.cta_from_round}")


# ----------------------------------------------------------------------------- the equations


def true_class_prob(logits: Tensor, labels: Tensor) -> Tensor:
    """s_k = sum_c 1[c = y_k] softmax(y_hat_k)_c (eq. 3)."""
    return logits.softmax(dim=1).gather(1, labels[:, None]).squeeze(1)


def discrepancy_ratio(scores: dict[str, Tensor]) -> tuple[str, str, float]:
    """rho = sum_B s^{m0} / sum_B s^{m1} (eq. 4) -> (dominant, weak, rho).

    ``scores``: two modalities' s_k over the same samples, in the data set's
    modality order (m0 first). rho > 1: m0 dominates; rho <= 1: m1 does (eq. 5's cases).
    """
    (m0, s0), (m1, s1) = list(scores.items())
    rho = float(s0.sum() / s1.sum().clamp_min(1e-12))
    return (m0, m1, rho) if rho > 1 else (m1, m0, rho)


def class_temperatures(s_dom: Tensor, s_weak: Tensor, labels: Tensor, num_classes: int,
                       temperature: float, beta: float) -> Tensor:
    """T^c of eq. 9 from eq. 8's class-wise ratios, for the weak (student) side.

    rho_c = sum_{y_k = c} s_k^{dom} / sum_{y_k = c} s_k^{weak}; rho = mean of rho_c over
    the classes present; T^c = T / (1 + beta log(rho_c / rho)) if rho_c > rho, else T.
    Classes absent from the client keep T.
    """
    num = torch.zeros(num_classes, dtype=torch.float64, device=s_dom.device).index_add_(0, labels, s_dom.double())
    den = torch.zeros(num_classes, dtype=torch.float64, device=s_dom.device).index_add_(0, labels, s_weak.double())
    seen = torch.bincount(labels, minlength=num_classes) > 0
    rho_c = torch.where(seen, num / den.clamp_min(1e-12), torch.zeros_like(num))
    rho = rho_c[seen].mean()
    t = torch.full((num_classes,), float(temperature), dtype=torch.float64, device=s_dom.device)
    above = seen & (rho_c > rho)
    t[above] = temperature / (1 + beta * torch.log(rho_c[above] / rho))
    return t.float()


def response_distillation(teacher_logits: Tensor, student_logits: Tensor, t_teacher: float,
                          t_student: Tensor | float) -> Tensor:
    """L_rd = 1/|B| sum_k p_t,k log(p_t,k / p_s,k) (eq. 5), p = softmax(y_hat / T) (eq. 10);
    ``t_student``: a scalar or one temperature per sample (T^{y_k})."""
    p_t = (teacher_logits / t_teacher).softmax(dim=1)
    ts = t_student[:, None] if isinstance(t_student, Tensor) else t_student
    log_p_s = (student_logits / ts).log_softmax(dim=1)
    return (p_t * (p_t.clamp_min(1e-12).log() - log_p_s)).sum(dim=1).mean()


# ----------------------------------------------------------------------------- server and client


class FedCMIServer(MultimodalServer):
    # [dp] mode = "sample": DP-SGD with batch-level clipping (eq. 4's rho and eq. 5's teacher choice are over the
    # batch, so a sample's gradient depends on the batch; mmfl.core.dp_rows); the server reports the clients' epsilons
    dp_extra_modes = ("sample",)
    dp_sample_unit = "batch"

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.private = (INFIL,) if params.projector == "two" else ()  # the IP never travels

    def needs_infiltration(self) -> bool:
        return self.params.projector == "two"

    def reported_scalars(self):
        return ("cmi_rho", "cmi_rd", "cmi_rd_share", "cmi_t_student", "cmi_agree",
                *(f"cmi_teacher/{m}" for m in self.ctx.meta.modalities))


class FedCMIClient(MultimodalClient):
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def __init__(self, params: FedCMIParams, ctx):
        super().__init__(params, ctx)
        self.private = (INFIL,) if params.projector == "two" else ()
        self.probe = not params.uni_ce  # without TP nothing else trains heads[m]: probe them
        self.multi = len(ctx.modalities) >= 2
        self.teacher: nn.Module | None = None
        self.t_class: Tensor | None = None  # T^c for the client-level weak modality
        self.weak: str | None = None
        # per-batch diagnostics, averaged into the reply (see reply_scalars)
        self.rhos: list[float] = []
        self.rds: list[float] = []
        self.rd_shares: list[float] = []
        self.t_students: list[float] = []
        self.agrees: list[float] = []
        self.teachers: list[str] = []

    def begin(self, model, msg):
        p = self.params
        if not self.multi or not p.distill:
            return
        self.teacher = load_into(self.ctx.model("teacher"), {k: v.detach() for k, v in model_tensors(model).items()})
        self.teacher.eval()  # the global model as received (frozen copy, authors' code)
        if p.class_temperature and self.ctx.rnd >= p.cta_from_round and not self.private_training():
            # (under DP-SGD eq. 8-9's ratios over all the client's rows would couple every step: T for every class)
            self.t_class, self.weak = self._class_temperatures(model)

    def private_training(self) -> bool:
        return self.ctx.dp is not None and self.ctx.dp.mode == "sample"

    def train(self, msg):
        """Without [dp]: TrainingClient's loop. ``[dp] mode = "sample"``: DP-SGD with batch-level clipping
        (:func:`mmfl.core.dp_rows.batch_dpsgd_train`) on the same loss (eq. 7), class-wise temperatures
        off; the client's accountant takes (z / 2, q, steps) and its epsilon goes in the reply."""
        if not self.private_training():
            return super().train(msg)
        dp = self.ctx.dp
        model = self.load_model(msg)
        self.begin(model, msg)
        noise = torch.Generator(device="cpu").manual_seed(derive_seed(self.ctx.seed, "dpsgd-noise"))
        stats = batch_dpsgd_train(model, self.ctx.data, self.ctx.train, dp.clip_norm, dp.noise_multiplier,
                                  self.ctx.generator(), noise, self.loss_fn(msg))
        history = record_steps(read(self.ctx.state, DPSGD_HISTORY, tensor()), dp.noise_multiplier / 2,
                               stats["sample_rate"], stats["steps"])  # sensitivity 2C: multiplier z / 2
        write(self.ctx.state, DPSGD_HISTORY, history, tensor())
        if dp.noise_multiplier > 0:
            stats["dp/epsilon"] = history_epsilon(history, dp.delta)
        return self.finish(model, msg, stats)

    @torch.no_grad()
    def _class_temperatures(self, model) -> tuple[Tensor, str]:
        """Eq. 8-9 over the client's data, once at the start of local training (authors' code)."""
        model.eval()
        mods = list(self.ctx.modalities)[:2]
        scores = {m: [] for m in mods}
        ys = []
        for inputs, labels in self.ctx.data.batches(1000, shuffle=False):
            out = model(inputs)
            both = out["present"][mods[0]] & out["present"][mods[1]]
            for m in mods:
                scores[m].append(true_class_prob(out["mod_logits"][m][both], labels[both]))
            ys.append(labels[both])
        model.train()
        y = torch.cat(ys)
        s = {m: torch.cat(v) for m, v in scores.items()}
        dom, weak, _ = discrepancy_ratio(s)
        t = class_temperatures(s[dom], s[weak], y, self.ctx.meta.num_classes, self.params.temperature,
                               self.params.beta)
        return t, weak

    def loss(self, model, inputs, labels, msg):
        p = self.params
        out = model(inputs)
        loss = masked_ce(out["logits"], labels, out["any_present"])  # L_ce (rows holding no modality: none)
        if not self.multi:
            return loss + self.probe_loss(model, out, labels)  # unimodal client: CE only (discussion (3))
        if p.uni_ce:  # L_ce^{m0} + L_ce^{m1}
            for m, lg in out["mod_logits"].items():
                loss = loss + masked_ce(lg, labels, out["present"][m])
        else:
            loss = loss + self.probe_loss(model, out, labels)
        rd = None
        if p.distill and p.kappa > 0:
            rd = p.kappa * self._distill(model, out, inputs, labels)
            loss = loss + rd
        if p.mu > 0:  # eq. 6: base modules only (the IP is not one)
            loss = loss + p.mu / 2 * proximal(model, msg.arrays, skip=lambda n: n.startswith(INFIL))
        if rd is not None:  # kappa L_rd's share of eq. 7's loss
            self.rd_shares.append(float(rd.detach() / loss.detach().clamp_min(1e-12)))
        return loss

    def _distill(self, model, out, inputs, labels) -> Tensor:
        p = self.params
        mods = list(self.ctx.modalities)[:2]
        both = out["present"][mods[0]] & out["present"][mods[1]]
        if not bool(both.any()):
            return out["logits"].sum() * 0.0
        y = labels[both]
        scores = {m: true_class_prob(out["mod_logits"][m].detach()[both], y) for m in mods}  # eq. 3
        dom, weak, rho = discrepancy_ratio(scores)  # eq. 4
        self.rhos.append(rho)
        with torch.no_grad():  # the global model's dominant branch, SP output
            t = self.teacher
            teacher = t.heads[dom](t.proj[dom](t.encode(dom, inputs, both)))
        student = (out["ip_logits"] if p.projector == "two" else out["mod_logits"])[weak][both]
        t_student = self.t_class[y] if (self.t_class is not None and weak == self.weak) else p.temperature
        rd = response_distillation(teacher, student, p.temperature, t_student)  # eq. 5 / 10
        self.rds.append(float(rd.detach()))
        self.teachers.append(dom)
        self.t_students.append(float(t_student.mean()) if isinstance(t_student, Tensor) else float(t_student))
        self.agrees.append(float((student.detach().argmax(1) == teacher.argmax(1)).float().mean()))
        return rd

    def reply_scalars(self, model, stats):
        out = super().reply_scalars(model, stats)
        if not self.multi:  # a unimodal client does not train its head (CE of the joint output only)
            for m in self.ctx.modalities:
                out[f"{MODULE_WEIGHT}heads.{m}."] = 0.0
        for key, vals in (("cmi_rho", self.rhos), ("cmi_rd", self.rds), ("cmi_rd_share", self.rd_shares),
                          ("cmi_t_student", self.t_students), ("cmi_agree", self.agrees)):
            if vals:
                out[key] = sum(vals) / len(vals)
        if self.teachers:
            for m in list(self.ctx.modalities)[:2]:
                out[f"cmi_teacher/{m}"] = self.teachers.count(m) / len(self.teachers)
        if "dp/epsilon" in stats:  # [dp] mode = "sample": this client's epsilon so far
            out["dp/epsilon"] = stats["dp/epsilon"]
        return out


register("fedcmi", FedCMIParams, FedCMIServer, FedCMIClient,
         help="FedCMI: two projectors, distillation from the global dominant modality, class-wise temperature "
              "(Fan et al. 2023)")
