"""PCME: Probabilistic Cross-Modal Embedding (Chun, Oh, de Rezende, Kalantidis, Larlus,
"Probabilistic Embeddings for Cross-Modal Retrieval", CVPR 2021) -- the loss CreamFL's
authors train their image-text clients and the server's public epoch with
(``algorithm.multimodal_loss = "pcme"`` of :mod:`mmfl.algorithms.creamfl`).

Each item's embedding is a Gaussian ``N(mu, diag(exp(logvar)))`` (sec. 3.2.1, eq. 6); J
samples per item by reparameterisation; the match probability of a pair is the Monte-Carlo
mean over the J x J sample pairs (eq. 4, cross-modal form eq. 7) of
``sigmoid(-a ||z - z'||_2 + b)`` (eq. 5) with learnable scalars a, b; the soft contrastive
loss (eq. 3) is the binary cross-entropy of that probability over all matched (k = l) and
unmatched (k != l) pairs of the batch; the VIB term (HIB's regulariser, which PCME keeps) is
``KL(N(mu, sigma^2) || N(0, I))`` with weight ``beta``.

Equation numbers are those of the paper's sec. 3 (3.1.2: eq. 3-5, HIB's soft contrastive
loss, Monte-Carlo match probability, sigmoid of the distance; 3.2.1: eq. 6-7, the two
Gaussians and the cross-modal match probability).

Normalisation (the paper prints none): the authors' criterion sums the pair terms over all
B^2 pairs, once per direction (image-to-text and text-to-image: the same B^2 pairs twice),
plus ``beta`` times the KL summed over the items of both modalities. :func:`pcme_loss` is
that objective divided by ``2 B^2``: the mean over pairs plus ``beta / (2 B^2)`` times the
summed KL, so ``beta`` means what it means in the authors' configs and the loss is on a
per-pair scale (a few units, like InfoNCE's ``log B``) for the optimizer it shares with
CreamFL's LCR steps.

Everything here is a pure function on tensors except :func:`pcme_pair_loss`, which reads a
:class:`~mmfl.models.multimodal.MultimodalModel` built with ``uncertainty = true``
(:mod:`mmfl.models.uncertainty`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.errors import ConfigError

SAMPLES = 7  # J: the authors' num_samples (COCO, CUB and CreamFL configs)
VIB_WEIGHT = 1e-5  # beta: the authors' COCO config (CUB: 1e-3; CreamFL's configs: 0)

__all__ = ["SAMPLES", "VIB_WEIGHT", "kl_to_standard_normal", "match_logits", "match_probability",
           "pcme_loss", "pcme_pair_loss", "sample_embeddings", "soft_contrastive_loss"]


def sample_embeddings(mu: Tensor, logvar: Tensor, samples: int, generator: torch.Generator | None = None) -> Tensor:
    """J samples of ``N(mu, diag(exp(logvar)))`` per item by reparameterisation (eq. 6):
    ``z^j = mu + exp(logvar / 2) * eps^j``, ``eps^j ~ N(0, I)``.

    mu, logvar ``[B, D]`` -> ``[B, J, D]``; gradients reach mu and logvar. ``eps`` is drawn on
    ``generator``'s device (a CPU generator: the same draws on every device), else on mu's."""
    where = generator.device if generator is not None else mu.device
    eps = torch.randn(mu.shape[0], samples, mu.shape[1], generator=generator, dtype=mu.dtype,
                      device=where).to(mu.device)
    return mu.unsqueeze(1) + torch.exp(0.5 * logvar).unsqueeze(1) * eps


def match_logits(zx: Tensor, zy: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``s = -a ||z_x^j - z_y^j'||_2 + b`` for every item pair (k, l) and sample pair (j, j')
    (the argument of the sigmoid in eq. 5 / eq. 7).

    zx ``[B, J, D]``, zy ``[C, J', D]`` -> ``[B, C, J, J']``."""
    B, J, D = zx.shape
    C, J2, _ = zy.shape
    x, y = zx.reshape(B * J, D), zy.reshape(C * J2, D)
    sq = (x * x).sum(-1, keepdim=True) + (y * y).sum(-1).unsqueeze(0) - 2.0 * x @ y.t()
    dist = torch.sqrt(sq.clamp_min(0.0) + 1e-12)  # the small constant keeps the gradient finite at 0
    dist = dist.reshape(B, J, C, J2).permute(0, 2, 1, 3)
    return -a * dist + b


def match_probability(logits: Tensor) -> Tensor:
    """Eq. 4 / 7: ``p(m | x_k, y_l) = 1/J^2 sum_{j, j'} sigmoid(s_kl^{jj'})``.

    logits ``[B, C, J, J']`` (from :func:`match_logits`) -> ``[B, C]``."""
    return torch.sigmoid(logits).mean(dim=(-2, -1))


def soft_contrastive_loss(logits: Tensor, matched: Tensor) -> Tensor:
    """Eq. 3, the mean over the B x C item pairs: ``-log p`` for matched pairs, ``-log(1 - p)``
    for the others, with ``p`` of eq. 4 / 7 computed in log space
    (``log p = logsumexp_{jj'} logsigmoid(s) - log J^2``, ``1 - sigmoid(s) = sigmoid(-s)``).

    logits ``[B, C, J, J']``, matched bool ``[B, C]`` -> scalar."""
    flat = logits.flatten(-2)
    log_n = math.log(flat.shape[-1])
    log_p = torch.logsumexp(F.logsigmoid(flat), dim=-1) - log_n
    log_not_p = torch.logsumexp(F.logsigmoid(-flat), dim=-1) - log_n
    return -torch.where(matched, log_p, log_not_p).mean()


def kl_to_standard_normal(mu: Tensor, logvar: Tensor) -> Tensor:
    """The VIB term per item: ``KL(N(mu, diag(exp(logvar))) || N(0, I))
    = 1/2 sum_d (exp(logvar) + mu^2 - 1 - logvar)``.

    mu, logvar ``[B, D]`` -> ``[B]``."""
    return 0.5 * (logvar.exp() + mu.pow(2) - 1.0 - logvar).sum(-1)


def pcme_loss(mu_x: Tensor, logvar_x: Tensor, mu_y: Tensor, logvar_y: Tensor, a: Tensor, b: Tensor,
              samples: int = SAMPLES, vib_weight: float = VIB_WEIGHT,
              generator: torch.Generator | None = None) -> tuple[Tensor, dict[str, float]]:
    """PCME's objective on a batch of B pairs (row k of x matches row k of y, every other row
    is unmatched): eq. 3 over all B^2 pairs (mean) + ``vib_weight / (2 B^2)`` times the KL
    summed over both modalities' items (see the module doc for the normalisation).

    ``samples = 0``: no sampling and no KL, ``z = mu`` (J = 1 at zero variance): the soft
    contrastive loss on the means, which is what the CreamFL authors' code trains with (their
    encoders have no variance head, so their PCME criterion receives the means; ``vib_beta`` 0).

    mu_*, logvar_* ``[B, D]``; a, b scalars -> (scalar loss, {"soft_contrastive", "kl",
    "p_pos", "p_neg"} floats: the loss terms and the mean match probability of matched /
    unmatched pairs)."""
    n = mu_x.shape[0]
    if samples == 0:
        zx, zy = mu_x.unsqueeze(1), mu_y.unsqueeze(1)
    else:
        zx = sample_embeddings(mu_x, logvar_x, samples, generator)
        zy = sample_embeddings(mu_y, logvar_y, samples, generator)
    logits = match_logits(zx, zy, a, b)
    matched = torch.eye(n, dtype=torch.bool, device=mu_x.device)
    soft = soft_contrastive_loss(logits, matched)
    kl = kl_to_standard_normal(mu_x, logvar_x).sum() + kl_to_standard_normal(mu_y, logvar_y).sum()
    loss = soft + vib_weight / (2.0 * n * n) * kl if vib_weight and samples else soft
    with torch.no_grad():
        p = match_probability(logits)
        info = {"soft_contrastive": float(soft), "kl": float(kl) / n, "p_pos": float(p[matched].mean()),
                "p_neg": float(p[~matched].mean()) if n > 1 else float("nan")}
    return loss, info


def pcme_pair_loss(model: nn.Module, inputs: dict[str, Tensor], pair, samples: int = SAMPLES,
                   vib_weight: float = VIB_WEIGHT, generator: torch.Generator | None = None) -> Tensor:
    """PCME on a batch of ``pair`` = (x, y) modalities for a multimodal model with uncertainty
    heads: ``f = encoders[m](x)``, ``mu = normalize(proj[m](f))`` (the representation CreamFL
    exchanges, unchanged), ``logvar = uncertainty.logvar[m](f)``, then :func:`pcme_loss`."""
    heads = getattr(model, "uncertainty", None)
    if heads is None:
        raise ConfigError("algorithm.multimodal_loss = \"pcme\" needs PCME's uncertainty heads in the model: "
                          "set model.uncertainty = true (it also applies to every [[client_models]] entry "
                          "that does not set it)")
    mu, logvar = {}, {}
    for m in pair:
        f = model.encode(m, inputs)
        mu[m] = F.normalize(model.proj[m](f), dim=-1)
        logvar[m] = heads.logvar[m](f)
    x, y = pair
    loss, _ = pcme_loss(mu[x], logvar[x], mu[y], logvar[y], heads.a, heads.b, samples, vib_weight, generator)
    return loss
