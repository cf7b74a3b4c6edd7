"""What CreamFL's server and clients share (and its baselines reuse): representations of
the public set, the contrastive losses of eq. 1-3, the ensemble weights of FedET and
FedGEMS, the retrieval metrics, and the seeded public subset. Pure functions on tensors."""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.algorithms.pcme import pcme_pair_loss
from mmfl.core.aggregation import AGGREGATION_RULES, per_sample_rule
from mmfl.core.evaluation import retrieval_scores
from mmfl.core.retrieval import evaluate_retrieval
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed

GLOBAL = "global/"  # server -> client: global representations of the public set
CONSENSUS = "consensus/"  # server -> client (FedMD): last round's aggregated representations
REP = "rep/"  # client -> server: the client's representations of the public set
MODEL = "model/"  # client state: its own model


def reps_of(model: nn.Module, inputs: dict[str, Tensor], modalities) -> dict[str, Tensor]:
    """L2-normalised representations ``[B, d]`` of ``modalities`` (those the model holds)."""
    out = {}
    for m in modalities:
        if m in inputs and m in model.holds:
            out[m] = F.normalize(model.proj[m](model.encode(m, inputs)), dim=-1)
    return out


@torch.no_grad()
def public_reps(model: nn.Module, public, modalities, batch_size: int = 512) -> dict[str, Tensor]:
    """The model's normalised representations of the whole public set, per held modality."""
    was = model.training
    model.eval()
    parts: dict[str, list[Tensor]] = {}
    for inputs, _ in public.batches(batch_size, shuffle=False):
        for m, z in reps_of(model, inputs, modalities).items():
            parts.setdefault(m, []).append(z)
    model.train(was)
    return {m: torch.cat(v) for m, v in parts.items()}


def info_nce(a: Tensor, b: Tensor, temperature: float) -> Tensor:
    """Symmetric InfoNCE (CLIP) of paired, normalised ``a``, ``b`` ``[B, d]``: row k's positive is row k."""
    logits = a @ b.t() / temperature
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def pair_loss(model: nn.Module, inputs: dict[str, Tensor], z: dict[str, Tensor] | None, pair, params,
              generator: torch.Generator | None = None) -> Tensor:
    """The image-text task on a batch of pairs (``pair`` = the two modalities): InfoNCE of the
    representations ``z`` (``params.multimodal_loss = "infonce"``), or PCME (``"pcme"``, which
    reads the encoders itself for its variance heads; ``z`` is not used)."""
    if params.multimodal_loss == "pcme":  # Chun et al. 2021, eq. 3-7 (mmfl.algorithms.pcme)
        return pcme_pair_loss(model, inputs, pair, params.pcme_samples, params.pcme_vib_weight, generator)
    return info_nce(z[pair[0]], z[pair[1]], params.temperature)


def inter_loss(local: Tensor, global_other: Tensor, rows: Tensor, tau: float) -> Tensor:
    """Eq. 1, mean over the batch: ``-log softmax_j(local_k . other_j / tau)[j = k]`` over all |P| j.

    local ``[B, d]`` (public rows ``rows``), global_other ``[P, d]``. Memory ``B x P``."""
    return F.cross_entropy(local @ global_other.t() / tau, rows.to(local.device))


def intra_loss(local: Tensor, global_same: Tensor, prev: Tensor, tau: float) -> Tensor:
    """Eq. 2, mean over the batch: ``-log e^{l.g/tau} / (e^{l.g/tau} + e^{l.p/tau})``; all ``[B, d]``."""
    logits = torch.stack([(local * global_same).sum(-1), (local * prev).sum(-1)], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(local.shape[0], dtype=torch.long, device=local.device))


def variance_weights(local: Tensor) -> Tensor:
    """FedET's ensemble weights, on representations: per sample, each client's share of the
    summed variance of its representation entries. ``[C, P, d] -> [C, P]``."""
    v = local.var(dim=-1)
    return v / v.sum(0, keepdim=True).clamp_min(1e-12)


def entropy_selection_weights(local: Tensor, temperature: float = 1.0) -> Tensor:
    """FedGEMS's selection, on representations: per sample, the clients whose entropy of
    ``softmax(rep / T)`` is at most the mean over clients, uniformly. ``[C, P, d] -> [C, P]``."""
    p = torch.softmax(local / temperature, dim=-1)
    h = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)  # [C, P]
    # at or below the mean, up to float rounding (near-equal entropies can all round above their
    # mean); the lowest-entropy client is always kept, so no sample is left without a teacher
    mean = h.mean(0, keepdim=True)
    keep = (h <= mean + 1e-6 * mean.abs().clamp_min(1.0)) | (h == h.min(0, keepdim=True).values)
    keep = keep.to(local.dtype)
    return keep / keep.sum(0, keepdim=True)


def fedet_rule_weights(local: Tensor, **context) -> Tensor:
    """The ``fedet_variance`` rule's weights: :func:`variance_weights`. ``[C, P, d] -> [C, P]``."""
    return variance_weights(local)


def fedgems_rule_weights(local: Tensor, entropy_temperature: float = 1.0, **context) -> Tensor:
    """The ``fedgems_entropy`` rule's weights: :func:`entropy_selection_weights` at
    ``entropy_temperature``. ``[C, P, d] -> [C, P]``."""
    return entropy_selection_weights(local, entropy_temperature)


AGGREGATION_RULES.register("fedet_variance", help="representations [P, d]: FedET's variance-weighted ensemble, "
                                                  "per sample")(per_sample_rule(fedet_rule_weights))
AGGREGATION_RULES.register("fedgems_entropy", help="representations [P, d]: FedGEMS's entropy selection, per sample "
                                                   "(clients at or below the mean entropy, uniformly)")(
    per_sample_rule(fedgems_rule_weights))


def target_quality(glob: dict[str, Tensor], agg: dict[str, Tensor], pair: tuple[str, str]) -> dict[str, float]:
    """How good a teacher eq. 7's targets are: the R@1 sum (i2t + t2i, row k paired with row k) on
    the public set of the server's own representations (``server_public_r1_sum``) and of the
    aggregated client representations it distills toward (``target_public_r1_sum``), and their
    mean cosine per modality (``target_cos/<m>``). A target set that retrieves worse than the
    server's own representations can only pull the server toward worse retrieval."""
    a, b = pair
    out = {}
    if a in glob and b in glob and glob[a].shape[0] == glob[b].shape[0]:
        r = evaluate_retrieval(glob[a], glob[b], torch.arange(glob[a].shape[0], device=glob[a].device), "plain")
        out["server_public_r1_sum"] = r["i2t_r1"] + r["t2i_r1"]
        if a in agg and b in agg:
            r = evaluate_retrieval(F.normalize(agg[a], dim=-1), F.normalize(agg[b], dim=-1),
                                   torch.arange(agg[a].shape[0], device=agg[a].device), "plain")
            out["target_public_r1_sum"] = r["i2t_r1"] + r["t2i_r1"]
    for m, t in agg.items():
        out[f"target_cos/{m}"] = float(F.cosine_similarity(t, glob[m], dim=-1).mean())
    return out


def pair_modalities(meta) -> tuple[str, str]:
    mods = sorted(meta.modalities)
    if len(mods) != 2:
        raise ConfigError(f"data.name: CreamFL needs a paired data set with two modalities, "
                          f"'{meta.name}' has {mods}")
    return mods[0], mods[1]


def retrieval_metrics(model: nn.Module, test, meta, modalities: tuple[str, str], batch_size: int = 512) -> dict:
    """Image-to-text and text-to-image Recall@1/5/10 of ``model`` on ``test``
    (:func:`mmfl.core.evaluation.retrieval_scores` of its test-set representations)."""
    reps = public_reps(model, test, modalities, batch_size)
    a, b = modalities
    img, txt = (reps["image"], reps[b if a == "image" else a]) if "image" in modalities else (reps[a], reps[b])
    return retrieval_scores(img, txt, test, meta)


def select_public(public, size: int):
    """The first ``size`` rows of a fixed permutation of the public set (all if 0): the
    server and every client pick the same rows without exchanging them."""
    if not size or size >= len(public):
        return public
    gen = torch.Generator(device="cpu").manual_seed(derive_seed("public-subset", len(public)))
    return public.subset(torch.randperm(len(public), generator=gen, device="cpu")[:size].sort().values)
