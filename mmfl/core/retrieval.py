"""Cross-modal retrieval metrics: Recall@K, image-to-text and text-to-image.

The evaluation of CreamFL (Yu et al., ICLR 2023), which follows PCME and
Karpathy & Fei-Fei (2015) on the MS-COCO 5K test images (25,000 captions):

* embeddings are L2-normalised, similarity is the cosine (dot product);
* **i2t R@K**: the share of images whose best-ranked matching caption (any of
  its, usually 5, captions) is among the top K captions;
* **t2i R@K**: the share of captions whose image is among the top K images;
* **1K protocol**: the 5,000 images are cut into 5 folds of 1,000 consecutive
  images (with their captions); R@K is computed in each fold and averaged.
  **5K** is one pass over all 5,000 images;
* Table 1's "R@1_sum" is *not* ``i2t R@1 + t2i R@1``. The authors' code
  (FLAIR-THU/CreamFL, issue #18) reports
  ``rsum = 1K i2t R@1 + 1K t2i R@1 + 5K i2t R@1 + 5K t2i R@1``; e.g. CreamFL's
  row: 49.66 + 38.94 + 25.34 + 18.94 = 132.88. :func:`evaluate_retrieval`
  returns that as ``rsum_authors`` (under the 1K protocol, and under ``"fifths"``).
* **Fifths** (``"fifths"``), the analogue of 1K + 5K for a test set of a few hundred
  pairs (mmfl's emoji and mfeat sets, 383 and 400 pairs): the images are cut into 5
  *strided* folds, fold f = images i with ``i % 5 == f`` (with their captions), so each
  fold is a fifth of the test set holding every class even where the rows are sorted by
  class (consecutive blocks, the 1K rule, would give each fold two of ten classes); the
  ``fold_<key>`` values are the means over the 5 folds (the 1K analogue), the plain keys
  one pass over all images (the 5K analogue), and ``rsum_authors`` = ``fold_i2t_r1 +
  fold_t2i_r1 + i2t_r1 + t2i_r1``.

Similarities are computed ``chunk`` query rows at a time, so memory is
``chunk x N``, never ``N x N`` (the authors' code builds the full matrix; their
issue #10 is the resulting out-of-memory error).

**Ties** are counted against the query: a query's rank is the number of
non-matching gallery items whose similarity is ``>=`` that of its best
matching item. A collapsed model (all embeddings equal) therefore scores ~0,
not 100. With continuous embeddings ties do not occur and this equals the
usual ``argsort`` rank.

**Class level** (``img_labels``/``txt_labels``): for data paired only by class
(e.g. ``av_mnist``), a retrieved item counts as correct if it has the query's
label; the same formulas with "matching" meaning "same label".
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

FOLD = 1000  # images per fold of the 1K protocol
FOLDS = 5  # folds of the 1K protocol and of its small-set analogue "fifths"
FIVE_K = 5000  # the number of test images for which "auto" picks the 1K protocol
NO_MATCH = torch.iinfo(torch.long).max  # the rank of a query with no matching item: never a hit


def _check(img: Tensor, txt: Tensor, txt_to_img: Tensor | None, img_labels, txt_labels) -> None:
    if img.ndim != 2 or txt.ndim != 2 or img.shape[1] != txt.shape[1]:
        raise ValueError(f"img and txt must be [N, d] with the same d, got {tuple(img.shape)} and {tuple(txt.shape)}")
    if txt_to_img is not None:
        if txt_to_img.shape != (txt.shape[0],):
            raise ValueError(f"txt_to_img must be [N_t] = [{txt.shape[0]}], got {tuple(txt_to_img.shape)}")
        if txt_to_img.numel() and (int(txt_to_img.min()) < 0 or int(txt_to_img.max()) >= img.shape[0]):
            raise ValueError(f"txt_to_img values must lie in [0, {img.shape[0]})")
    if (img_labels is None) != (txt_labels is None):
        raise ValueError("class-level retrieval needs both img_labels and txt_labels")
    if img_labels is not None:
        if img_labels.shape != (img.shape[0],) or txt_labels.shape != (txt.shape[0],):
            raise ValueError("img_labels must be [N_i] and txt_labels [N_t]")
    elif txt_to_img is None:
        raise ValueError("give txt_to_img (instance pairing) or img_labels and txt_labels (class level)")


def _ranks(query: Tensor, gallery: Tensor, match_rows, chunk: int) -> Tensor:
    """Per query row: the number of non-matching gallery items scoring ``>=`` its best matching item
    (:data:`NO_MATCH` where it has none). ``match_rows(start, stop) -> bool [stop-start, N_g]``."""
    out = torch.empty(query.shape[0], dtype=torch.long, device=query.device)
    for s in range(0, query.shape[0], chunk):
        e = min(s + chunk, query.shape[0])
        sims = query[s:e] @ gallery.T
        match = match_rows(s, e)
        best = sims.masked_fill(~match, float("-inf")).amax(dim=1, keepdim=True)
        rank = ((sims >= best) & ~match).sum(dim=1)
        rank[~match.any(dim=1)] = NO_MATCH
        out[s:e] = rank
    return out


def _t2i_ranks(txt: Tensor, img: Tensor, t2i: Tensor, chunk: int) -> Tensor:
    """Instance pairing, caption queries: one matching image each; its score is read from the same
    similarity matrix, so ``>=`` counts it exactly once."""
    out = torch.empty(txt.shape[0], dtype=torch.long, device=txt.device)
    for s in range(0, txt.shape[0], chunk):
        e = min(s + chunk, txt.shape[0])
        sims = txt[s:e] @ img.T
        best = sims.gather(1, t2i[s:e, None])
        out[s:e] = (sims >= best).sum(dim=1) - 1
    return out


def _i2t_ranks(img: Tensor, txt: Tensor, t2i: Tensor, chunk: int) -> Tensor:
    """Instance pairing, image queries: best matching caption by a scatter-max over the chunk's
    matching entries, then (items >= best) minus (matching items >= best)."""
    out = torch.empty(img.shape[0], dtype=torch.long, device=img.device)
    cols = torch.arange(txt.shape[0], device=txt.device)
    for s in range(0, img.shape[0], chunk):
        e = min(s + chunk, img.shape[0])
        sims = img[s:e] @ txt.T
        js = cols[(t2i >= s) & (t2i < e)]
        rows = t2i[js] - s
        vals = sims[rows, js]
        best = torch.full((e - s,), float("-inf"), dtype=sims.dtype, device=sims.device).scatter_reduce(
            0, rows, vals, reduce="amax")
        ge = (sims >= best[:, None]).sum(dim=1)
        matched_ge = torch.zeros(e - s, dtype=torch.long, device=sims.device).index_add_(
            0, rows, (vals >= best[rows]).long())
        rank = ge - matched_ge
        rank[best == float("-inf")] = NO_MATCH  # an image without captions
        out[s:e] = rank
    return out


def recall_at_k(img: Tensor, txt: Tensor, txt_to_img: Tensor | None = None, ks: Sequence[int] = (1, 5, 10),
                chunk: int = 1024, *, img_labels: Tensor | None = None,
                txt_labels: Tensor | None = None) -> dict[str, float]:
    """Recall@K in percent, both directions, over one set of images and captions.

    ``img`` ``[N_i, d]``, ``txt`` ``[N_t, d]``; ``txt_to_img`` int64 ``[N_t]`` is
    the image index of each caption (several captions may share an image). With
    ``img_labels`` ``[N_i]`` and ``txt_labels`` ``[N_t]`` the retrieval is class
    level (a same-label item is a hit) and ``txt_to_img`` is ignored. A query with
    no matching item at all (an image without captions, a label absent from the
    other side) counts as a miss.

    Returns ``i2t_r{k}`` and ``t2i_r{k}`` for each k in ``ks``, ``r1_sum`` =
    ``i2t_r1 + t2i_r1`` (when 1 is in ``ks``) and ``rsum`` = the sum of all
    ``i2t_*`` and ``t2i_*`` values (the PCME/VSE "rsum" over six terms for the
    default ``ks``). Note that the CreamFL paper's "R@1_sum" is neither: it is
    the four-term ``rsum_authors`` of :func:`evaluate_retrieval` (1K + 5K R@1).
    """
    _check(img, txt, txt_to_img, img_labels, txt_labels)
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    with torch.autocast(device_type=img.device.type, enabled=False):  # fp32 scores (bf16 would tie ranks)
        return _recall_at_k(img, txt, txt_to_img, ks, chunk, img_labels, txt_labels)


def _recall_at_k(img, txt, txt_to_img, ks, chunk, img_labels, txt_labels) -> dict[str, float]:
    img = F.normalize(img.float(), dim=1)
    txt = F.normalize(txt.float(), dim=1)
    if img_labels is not None:
        il, tl = img_labels.long().to(img.device), txt_labels.long().to(img.device)

        def i2t_match(s, e):
            return il[s:e, None] == tl[None, :]

        def t2i_match(s, e):
            return tl[s:e, None] == il[None, :]

        ranks = {"i2t": _ranks(img, txt, i2t_match, chunk), "t2i": _ranks(txt, img, t2i_match, chunk)}
    else:
        t2i = txt_to_img.long().to(img.device)
        ranks = {"i2t": _i2t_ranks(img, txt, t2i, chunk), "t2i": _t2i_ranks(txt, img, t2i, chunk)}
    out: dict[str, float] = {}
    for direction, r in ranks.items():
        for k in ks:
            out[f"{direction}_r{k}"] = 100.0 * float((r < k).float().mean()) if r.numel() else 0.0
    if 1 in ks:
        out["r1_sum"] = out["i2t_r1"] + out["t2i_r1"]
    out["rsum"] = sum(v for key, v in out.items() if key.startswith(("i2t_", "t2i_")))
    return out


def _fold(img, txt, txt_to_img, img_labels, txt_labels, f: int):
    """Images ``[f*1000, (f+1)*1000)`` and the captions of those images, re-indexed."""
    lo, hi = f * FOLD, (f + 1) * FOLD
    sel = (txt_to_img >= lo) & (txt_to_img < hi)
    return (img[lo:hi], txt[sel], txt_to_img[sel] - lo,
            None if img_labels is None else img_labels[lo:hi],
            None if txt_labels is None else txt_labels[sel])


def evaluate_retrieval(img: Tensor, txt: Tensor, txt_to_img: Tensor | None = None, protocol: str = "auto", *,
                       class_level: bool = False, img_labels: Tensor | None = None,
                       txt_labels: Tensor | None = None, ks: Sequence[int] = (1, 5, 10),
                       chunk: int = 1024) -> dict:
    """Recall@K under a test protocol; a flat dict of floats plus ``"protocol"``.

    * ``"plain"``: :func:`recall_at_k` over everything;
    * ``"1k"``: the 5-fold 1K protocol (needs exactly 5,000 images and
      ``txt_to_img``): fold f = images ``1000f .. 1000f+999`` in the given order
      with their captions; the plain keys (``i2t_r1`` ...) are the means over the
      5 folds, ``5k_<key>`` the one-pass values over all 5,000 images, and
      ``rsum_authors`` = ``i2t_r1 + t2i_r1 + 5k_i2t_r1 + 5k_t2i_r1``, the number
      CreamFL's Table 1 calls "R@1_sum";
    * ``"fifths"``: the 1K/5K analogue for any size (needs ``txt_to_img`` and at
      least 5 images): fold f = the images ``i`` with ``i % 5 == f`` and their
      captions; the plain keys are one pass over all images, ``fold_<key>`` the
      means over the 5 folds, ``rsum_authors`` = ``fold_i2t_r1 + fold_t2i_r1 +
      i2t_r1 + t2i_r1`` (the module docstring says why strided folds);
    * ``"auto"``: ``"1k"`` when there are exactly 5,000 images and ``txt_to_img``
      is given, else ``"plain"``.

    ``class_level=True`` scores a hit by label (``img_labels``, ``txt_labels``
    required); under ``"1k"`` the folds still come from ``txt_to_img``.
    """
    if class_level and (img_labels is None or txt_labels is None):
        raise ValueError("class_level=True needs img_labels and txt_labels")
    if not class_level:
        img_labels = txt_labels = None
    if protocol == "auto":
        protocol = "1k" if img.shape[0] == FIVE_K and txt_to_img is not None else "plain"
    if protocol == "plain":
        return {"protocol": "plain", **recall_at_k(img, txt, txt_to_img, ks, chunk, img_labels=img_labels,
                                                   txt_labels=txt_labels)}
    if protocol == "fifths":
        return _fifths(img, txt, txt_to_img, img_labels, txt_labels, ks, chunk)
    if protocol != "1k":
        raise ValueError(f"protocol must be 'auto', '1k', 'fifths' or 'plain', got {protocol!r}")
    if img.shape[0] != FIVE_K or txt_to_img is None:
        raise ValueError(f"the 1K protocol needs exactly {FIVE_K} images and txt_to_img, got {img.shape[0]} images")
    _check(img, txt, txt_to_img, img_labels, txt_labels)
    txt_to_img = txt_to_img.long().to(img.device)
    img_labels, txt_labels = (None if t is None else t.to(img.device) for t in (img_labels, txt_labels))
    folds = []
    for f in range(FIVE_K // FOLD):
        fi, ft, fmap, fil, ftl = _fold(img, txt, txt_to_img, img_labels, txt_labels, f)
        folds.append(recall_at_k(fi, ft, fmap, ks, chunk, img_labels=fil, txt_labels=ftl))
    out: dict = {"protocol": "1k"}
    for key in folds[0]:
        out[key] = sum(r[key] for r in folds) / len(folds)
    full = recall_at_k(img, txt, txt_to_img, ks, chunk, img_labels=img_labels, txt_labels=txt_labels)
    out.update({f"5k_{k}": v for k, v in full.items()})
    if 1 in ks:
        out["rsum_authors"] = out["i2t_r1"] + out["t2i_r1"] + full["i2t_r1"] + full["t2i_r1"]
    return out


def _fifths(img, txt, txt_to_img, img_labels, txt_labels, ks, chunk) -> dict:
    """The ``"fifths"`` protocol of :func:`evaluate_retrieval`."""
    if txt_to_img is None or img.shape[0] < FOLDS:
        raise ValueError(f"the fifths protocol needs txt_to_img and at least {FOLDS} images, got {img.shape[0]}")
    _check(img, txt, txt_to_img, img_labels, txt_labels)
    t2i = txt_to_img.long().to(img.device)
    full = recall_at_k(img, txt, t2i, ks, chunk, img_labels=img_labels, txt_labels=txt_labels)
    folds = []
    for f in range(FOLDS):
        keep = torch.arange(f, img.shape[0], FOLDS, device=img.device)  # images i with i % 5 == f
        sel = (t2i % FOLDS) == f
        folds.append(recall_at_k(img[keep], txt[sel], torch.div(t2i[sel], FOLDS, rounding_mode="floor"), ks, chunk,
                                 img_labels=None if img_labels is None else img_labels[keep],
                                 txt_labels=None if txt_labels is None else txt_labels[sel.to(txt_labels.device)]))
    out: dict = {"protocol": "fifths", **full}
    out.update({f"fold_{k}": sum(r[k] for r in folds) / FOLDS for k in folds[0]})
    if 1 in ks:
        out["rsum_authors"] = out["fold_i2t_r1"] + out["fold_t2i_r1"] + full["i2t_r1"] + full["t2i_r1"]
    return out


def pairs_to_retrieval(image: Tensor, text: Tensor, image_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Pair rows (one per caption, the image repeated) -> ``(img [N_i, d], txt [N, d], txt_to_img [N])``.

    ``image_index`` ``[N]`` names each row's image (any integers, e.g. a caption
    loader's ``meta.info["image_index"][split]``); images are kept once, in order
    of first appearance, so consecutive images stay consecutive (the 1K folds).
    """
    ids = image_index.long().to(image.device)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.long, device=ids.device).scatter_reduce(
        0, inverse, torch.arange(ids.numel(), device=ids.device), reduce="amin")
    order = torch.argsort(first)  # unique images by first appearance
    new_id = torch.empty_like(order)
    new_id[order] = torch.arange(order.numel(), device=ids.device)
    return image[first[order]], text, new_id[inverse]
