"""PartialFL's terms (:mod:`mmfl.algorithms.partialfl` has the protocol): the message and state keys,
the anchored contrastive loss of eq. 1 / 2 / 4 and the views of the ``multimodal`` model the three
models F_s, F_g and F_k are made of (which modality is shareable, F_g's keys, a branch's embedding)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmfl.algorithms.multimodal import only_held
from mmfl.errors import ConfigError

X = "x/"  # client -> server, once: the client's shareable data, in its row order
ZT = "zt"  # server -> client: the server model's embeddings z_T of the client's rows
ZPRIME = "zprime"  # client -> server: the local model's embeddings z'_T of the client's rows
LOCAL = "local/"  # client state: F_k


def anchored_contrastive(anchor: Tensor, positive: Tensor, tau: float, rows: Tensor | None = None) -> Tensor:
    """Eq. 1 / 2 / 4, mean over the batch:
    ``-log e^{a_i.p_i/tau} / (sum_{j != i} e^{a_i.a_j/tau} + e^{a_i.p_i/tau})`` --
    the positive is the other embedding of the same sample, the negatives are the
    *anchor's own* embeddings of the batch's other samples (intra-modal negatives).
    ``anchor``, ``positive``: L2-normalised ``[B, d]``. ``rows`` (bool ``[B]``; None: all): the
    samples with both embeddings present, the only anchors and negatives (0 with none)."""
    if rows is not None and not bool(rows.all()):
        rows = rows.to(anchor.device)
        if not bool(rows.any()):
            return anchor.sum() * 0.0
        anchor, positive = anchor[rows], positive[rows]
    b = anchor.shape[0]
    pos = (anchor * positive).sum(-1, keepdim=True) / tau  # [B, 1]
    neg = anchor @ anchor.t() / tau
    neg = neg.masked_fill(torch.eye(b, dtype=torch.bool, device=neg.device), float("-inf"))  # j != i
    logits = torch.cat([pos, neg], dim=1)
    return (torch.logsumexp(logits, dim=1) - pos.squeeze(1)).mean()


def shareable_of(meta, name: str) -> tuple[str, str]:
    """(shareable S, private P) among the data set's two modalities."""
    mods = sorted(meta.modalities)
    if len(mods) != 2:
        raise ConfigError(f"data.name: PartialFL needs a data set with two modalities (a shareable and a "
                          f"private one), '{meta.name}' has {mods}")
    s = name or ("text" if "text" in mods else mods[1])
    if s not in mods:
        raise ConfigError(f"algorithm.shareable: {s!r} is not a modality of '{meta.name}' ({', '.join(mods)})")
    return s, next(m for m in mods if m != s)


def global_keys(model: nn.Module, private: str, variant: str, holds) -> list[str]:
    """The state-dict keys of F_g a client holding ``holds`` trains and exchanges."""
    return list(only_held(model.state_dict(), (private,) if variant == "private" else tuple(holds)))


def branch_embed(model: nn.Module, m: str, x: Tensor, lengths: Tensor | None = None) -> Tensor:
    """``proj[m](encoders[m](x))`` (unnormalised); ``lengths``: a padded sequence's valid lengths."""
    return model.proj[m](model.encoders[m](x, lengths))


def require_model(model: nn.Module, variant: str) -> None:
    if not all(hasattr(model, a) for a in ("encoders", "proj", "heads", "fusion", "classifier")):
        raise ConfigError("model.name: PartialFL needs model.name = \"multimodal\", "
                          f"got a {type(model).__name__}")
    if variant == "both" and model.fusion_out_dim != model.feat_dim:
        raise ConfigError("model.fusion: PartialFL's multimodal global model aligns the fusion output with "
                          f"z_T, so it must have feat_dim values: use fusion 'sum', 'film' or 'gated', not "
                          f"{model.fusion_kind!r}")
