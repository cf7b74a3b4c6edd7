"""Terms over a public set, computed in row chunks so memory stays bounded.

CreamFL's global-local contrastive aggregation (GCA; Yu et al., ICLR 2023,
section 3.3) scores each client's representation of public sample k by how well
it matches the *other* modality's global representation of the same sample
against all other public samples, then averages the clients' representations
with softmax-over-clients weights:

    s^(k,c) = log softmax_j( i_local^(k,c) . t_global^(j) ) [j = k]     (eq. 4, as the authors' code computes it)
    alpha^(k,.) = softmax_c( s^(k,1), ..., s^(k,C) )                     (eq. 5)
    i^(k) = sum_c alpha^(k,c) i_local^(k,c)                              (eq. 6)

and symmetrically for text (local text against global images). The authors'
code takes ``diag(log_softmax(local_img @ global_txt.T))`` over the full
``|P| x |P|`` matrix (50,000^2 floats = 10 GB; their issue #10 is the OOM);
here each client's rows go through in chunks, so the extra memory is about
``chunk * |P|`` floats whatever ``|P|`` is, one buffer reused by every chunk. ``exclude_positive=True`` gives
the paper's printed eq. 4, whose denominator sums over ``j != k`` only.

All functions are pure: tensors in, tensors out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmfl.core.aggregation import AGGREGATION_RULES, per_sample_mean, per_sample_rule

DEFAULT_CHUNK = 1024  # rows per chunk: 2 x 1024 x 50,000 floats = 410 MB of temporaries


def global_local_contrastive_scores(local: Tensor, global_other: Tensor, chunk: int = DEFAULT_CHUNK,
                                    exclude_positive: bool = False, candidates: Tensor | None = None) -> Tensor:
    """s^(k,c) of eq. 4.

    local: ``[C, P, d]`` client representations of the public set (one modality);
    global_other: ``[P, d]`` the server's representations of the other modality.
    ``candidates`` (bool ``[P]``, None: all): the public rows whose other modality is present,
    the only j of the denominator (a public set missing modalities).
    Returns ``[C, P]`` (float32). Memory: one ``chunk x P`` logits buffer, reused by every
    chunk (the exponentials are taken in place).
    """
    C, P, d = local.shape
    if global_other.shape != (P, d):
        raise ValueError(f"global_other: expected shape {(P, d)}, got {tuple(global_other.shape)}")
    out = torch.empty(C, P, dtype=torch.float32, device=local.device)
    g_t = global_other.t()
    # one logits buffer for every chunk, written in place (out=, in-place exp): a fresh chunk x P
    # temporary per chunk (~205 MB at P = 50,000) costs page faults, a quarter of the time in the kernel
    # under autocast (precision = "bf16") matmul computes in another dtype than its inputs', which
    # an out= buffer cannot follow: there each chunk takes its own temporary, as before
    reuse = not torch.is_autocast_enabled(local.device.type)
    buf = torch.empty(min(chunk, P) if reuse else 0, P, dtype=torch.result_type(local, global_other),
                      device=local.device)
    lse = torch.empty(min(chunk, P), dtype=buf.dtype, device=local.device)
    if candidates is not None:
        absent = ~candidates.to(local.device).unsqueeze(0)
    for c in range(C):
        for s in range(0, P, chunk):
            e = min(P, s + chunk)
            rows = local[c, s:e]
            logits = torch.matmul(rows, g_t, out=buf[:e - s]) if reuse else rows @ g_t  # [chunk, P]
            positive = (rows * global_other[s:e]).sum(-1)  # the diagonal, i_local^(k) . t_global^(k)
            if exclude_positive:
                dev = logits.device
                logits[torch.arange(e - s, device=dev), torch.arange(s, e, device=dev)] = float("-inf")
            if candidates is not None:
                logits.masked_fill_(absent, float("-inf"))
            out[c, s:e] = positive - (_logsumexp_(logits, lse[:e - s]) if reuse else torch.logsumexp(logits, dim=1))
            if candidates is not None:  # a row lacking the other modality has no positive: no evidence,
                out[c, s:e].masked_fill_(~candidates[s:e].to(out.device), 0.0)  # equal scores (eq. 5: equal weights)
    return out


def _logsumexp_(x: Tensor, out: Tensor) -> Tensor:
    """``torch.logsumexp(x, dim=1)`` into ``out``, overwriting ``x`` (no ``x``-sized temporary);
    the same operations as torch's own (max, with infinite maxima taken as 0; exp of the
    difference; sum; log; plus the max), so the same bits."""
    m = torch.amax(x, dim=1, keepdim=True)
    m.masked_fill_(m.abs() == float("inf"), 0)
    torch.sum(x.sub_(m).exp_(), dim=1, out=out)
    return out.log_().add_(m.squeeze(1))


def global_local_contrastive_weights(scores: Tensor) -> Tensor:
    """alpha of eq. 5: softmax over clients of ``scores [C, P]``; returns ``[C, P]``."""
    return torch.softmax(scores, dim=0)


def aggregate_representations(local: Tensor, weights: Tensor, chunk: int = 8192) -> Tensor:
    """Eq. 6: ``sum_c weights[c, k] * local[c, k]``; local ``[C, P, d]``, weights ``[C, P]`` -> ``[P, d]``
    (:func:`mmfl.core.aggregation.per_sample_mean`)."""
    return per_sample_mean(local, weights, chunk)


def gca_weights(local: Tensor, key: str, global_reps: dict[str, Tensor] | None = None,
                pair: tuple[str, str] | None = None, chunk: int = DEFAULT_CHUNK, exclude_positive: bool = False,
                public_present: dict[str, Tensor] | None = None, **context) -> Tensor:
    """alpha of eq. 4-5 for the representations of modality ``key`` (local ``[C, P, d]``), scored
    against the server's global representations of the other modality of ``pair``
    (``global_reps[other]``, ``[P, d]``); ``public_present`` (modality -> bool ``[P]``): the
    public rows holding each modality (only they are candidates). Returns ``[C, P]``."""
    if global_reps is None or pair is None or key not in pair:
        raise ValueError("the 'gca' rule needs global_reps={modality: [P, d]} and pair=(m1, m2) "
                         "(CreamFL's server gives them)")
    other = pair[1] if key == pair[0] else pair[0]
    cand = (public_present or {}).get(other)
    scores = global_local_contrastive_scores(local, global_reps[other], chunk, exclude_positive, cand)  # eq. 4
    own = (public_present or {}).get(key)
    if own is not None:  # a row lacking the modality itself: no representation to score, equal scores
        scores = scores.masked_fill(~own.to(scores.device).unsqueeze(0), 0.0)
    return global_local_contrastive_weights(scores)  # eq. 5


AGGREGATION_RULES.register("gca", help="representations [P, d]: CreamFL's global-local contrastive aggregation, "
                                       "eq. 4-6 (needs the server's global representations)")(
    per_sample_rule(gca_weights))


def global_local_contrastive_aggregation(local_img: Tensor, global_txt: Tensor, local_txt: Tensor | None = None,
                                         global_img: Tensor | None = None, chunk: int = DEFAULT_CHUNK,
                                         exclude_positive: bool = False) -> tuple[Tensor, Tensor | None]:
    """CreamFL's GCA for both modalities: image reps scored against global text, text reps
    against global images (eq. 4-6). local_*: ``[C, P, d]`` (the clients holding that
    modality); global_*: ``[P, d]``. Returns ``(aggregated images [P, d], aggregated texts [P, d] or None)``.
    """
    img = aggregate_representations(local_img, global_local_contrastive_weights(
        global_local_contrastive_scores(local_img, global_txt, chunk, exclude_positive)))
    txt = None
    if local_txt is not None:
        if global_img is None:
            raise ValueError("local_txt needs global_img")
        txt = aggregate_representations(local_txt, global_local_contrastive_weights(
            global_local_contrastive_scores(local_txt, global_img, chunk, exclude_positive)))
    return img, txt
