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
from mmfl.data.base import PRESENT
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed

GLOBAL = "global/"  # server -> client: global representations of the public set
CONSENSUS = "consensus/"  # server -> client (FedMD): last round's aggregated representations
REP = "rep/"  # client -> server: the client's representations of the public set
MODEL = "model/"  # client state: its own model


def reps_of(model: nn.Module, inputs: dict[str, Tensor], modalities) -> dict[str, Tensor]:
    """L2-normalised representations ``[B, d]`` of ``modalities`` (those the model holds); a row
    lacking ``m`` (``present/<m>`` False) is never encoded and gets zeros (:func:`present_of`
    tells the losses which rows to use)."""
    out = {}
    for m in modalities:
        if m in inputs and m in model.holds:
            out[m] = F.normalize(model.encode_present(m, inputs, model.proj[m]), dim=-1)
    return out


def present_of(data_or_inputs, m: str) -> Tensor | None:
    """Bool ``[N]``: the rows holding ``m`` of a batch's inputs (a dict) or of a whole data set
    (its view's rows); None when every row does (no ``present/<m>`` mask)."""
    if isinstance(data_or_inputs, dict):
        mask = data_or_inputs.get(PRESENT + m)
        return None if mask is None else mask.to(torch.bool).reshape(-1)
    mask = data_or_inputs.features.get(PRESENT + m)
    if mask is None:
        return None
    if data_or_inputs.indices is not None:
        mask = mask[data_or_inputs.indices.to(mask.device)]
    return mask.to(torch.bool).reshape(-1)


def both_present(inputs, pair) -> Tensor | None:
    """The rows of a batch's inputs (a dict) or of a data set holding both modalities of
    ``pair`` (None: every row; :func:`present_of`)."""
    masks = [k for k in (present_of(inputs, m) for m in pair) if k is not None]
    if not masks:
        return None
    return masks[0] & masks[1] if len(masks) == 2 else masks[0]


def take_rows(inputs: dict[str, Tensor], rows: Tensor) -> dict[str, Tensor]:
    """Every per-sample tensor of a batch's ``inputs`` at the bool ``rows``."""
    return {k: v[rows.to(v.device)] for k, v in inputs.items()}


def zero_loss(model: nn.Module) -> Tensor:
    """A loss of 0 on the graph of every trainable parameter of ``model`` (a batch with no row
    that gives the term: backward and the optimizer step still run)."""
    return sum(q.sum() for q in model.parameters() if q.requires_grad) * 0.0


def masked_mse(z: Tensor, target: Tensor, mask: Tensor | None) -> Tensor:
    """MSE over the rows where ``mask`` (None: all) holds; 0 with none."""
    if mask is None:
        return F.mse_loss(z, target)
    mask = mask.to(z.device)
    if not bool(mask.any()):
        return z.sum() * 0.0
    return F.mse_loss(z[mask], target[mask])


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
    reads the encoders itself for its variance heads; ``z`` is not used). Only the rows holding
    both modalities are pairs (every positive and every negative has both sides present); with
    fewer than two such rows the loss is 0."""
    both = both_present(inputs, pair)
    if both is not None and not bool(both.all()):
        if int(both.sum()) < 2:
            return zero_loss(model)
        inputs = take_rows(inputs, both)
        z = None if z is None else {m: t[both.to(t.device)] for m, t in z.items()}
    if params.multimodal_loss == "pcme":  # Chun et al. 2021, eq. 3-7 (mmfl.algorithms.pcme)
        return pcme_pair_loss(model, inputs, pair, params.pcme_samples, params.pcme_vib_weight, generator)
    return info_nce(z[pair[0]], z[pair[1]], params.temperature)


def _ce_rows(logits: Tensor, target: Tensor, row_ok: Tensor | None, local: Tensor) -> Tensor:
    """Cross-entropy of eq. 1 / eq. 2 over the rows ``row_ok`` (None: all); 0 (on ``local``'s
    graph) with none."""
    if row_ok is not None:
        row_ok = row_ok.to(local.device)
        if not bool(row_ok.any()):
            return local.sum() * 0.0
        logits, target = logits[row_ok], target[row_ok]
    return F.cross_entropy(logits, target)


def inter_loss(local: Tensor, global_other: Tensor, rows: Tensor, tau: float, row_ok: Tensor | None = None,
               col_ok: Tensor | None = None) -> Tensor:
    """Eq. 1, mean over the batch: ``-log softmax_j(local_k . other_j / tau)[j = k]`` over all |P| j.

    local ``[B, d]`` (public rows ``rows``), global_other ``[P, d]``. Memory ``B x P``. With a
    public set missing modalities: ``row_ok`` (bool ``[B]``) the batch rows that are anchors
    (holding both modalities), ``col_ok`` (bool ``[P]``) the public rows whose other modality is
    present (the only candidates j, negatives included); 0 with no anchor."""
    logits = local @ global_other.t() / tau
    target = rows.to(local.device)
    if col_ok is not None:
        logits = logits.masked_fill(~col_ok.to(logits.device).unsqueeze(0), float("-inf"))
    return _ce_rows(logits, target, row_ok, local)


def intra_loss(local: Tensor, global_same: Tensor, prev: Tensor, tau: float, row_ok: Tensor | None = None) -> Tensor:
    """Eq. 2, mean over the batch: ``-log e^{l.g/tau} / (e^{l.g/tau} + e^{l.p/tau})``; all ``[B, d]``;
    ``row_ok`` (bool ``[B]``): the rows holding the modality (the others give no term)."""
    logits = torch.stack([(local * global_same).sum(-1), (local * prev).sum(-1)], dim=1) / tau
    target = torch.zeros(local.shape[0], dtype=torch.long, device=local.device)
    return _ce_rows(logits, target, row_ok, local)


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


def target_quality(glob: dict[str, Tensor], agg: dict[str, Tensor], pair: tuple[str, str],
                   present: dict[str, Tensor | None] | None = None) -> dict[str, float]:
    """How good a teacher eq. 7's targets are: the R@1 sum (i2t + t2i, row k paired with row k) on
    the public set of the server's own representations (``server_public_r1_sum``) and of the
    aggregated client representations it distills toward (``target_public_r1_sum``), and their
    mean cosine per modality (``target_cos/<m>``). A target set that retrieves worse than the
    server's own representations can only pull the server toward worse retrieval. ``present``
    (modality -> bool ``[P]``, None: every row): a public set missing modalities; the R@1 sums
    are over the rows holding both, the cosines over the rows holding the modality."""
    a, b = pair
    has = {m: (present or {}).get(m) for m in pair}
    both = [k for k in has.values() if k is not None]
    both = None if not both else (both[0] & both[1] if len(both) == 2 else both[0])
    at = lambda t, rows: t if rows is None else t[rows.to(t.device)]  # noqa: E731
    out = {}
    if a in glob and b in glob and glob[a].shape[0] == glob[b].shape[0]:
        ga, gb = at(glob[a], both), at(glob[b], both)
        r = evaluate_retrieval(ga, gb, torch.arange(ga.shape[0], device=ga.device), "plain")
        out["server_public_r1_sum"] = r["i2t_r1"] + r["t2i_r1"]
        if a in agg and b in agg:
            ta, tb = at(agg[a], both), at(agg[b], both)
            r = evaluate_retrieval(F.normalize(ta, dim=-1), F.normalize(tb, dim=-1),
                                   torch.arange(ta.shape[0], device=ta.device), "plain")
            out["target_public_r1_sum"] = r["i2t_r1"] + r["t2i_r1"]
    for m, t in agg.items():
        out[f"target_cos/{m}"] = float(F.cosine_similarity(at(t, has.get(m)), at(glob[m], has.get(m)), dim=-1).mean())
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
    both = both_present(test, modalities)  # a test set missing modalities: retrieval over the rows holding both
    if both is not None and not bool(both.all()):
        test = test.subset(both.nonzero().squeeze(1).cpu().numpy())
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
