"""Recall@K (mmfl.core.retrieval) on constructed cases with known answers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmfl.core.retrieval import evaluate_retrieval, pairs_to_retrieval, recall_at_k

KEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10"]


def reference(img, txt, i_match):
    """Brute force with argsort over the full matrix: ``i_match[i, j]`` = caption j is a hit for image i."""
    sims = F.normalize(img, dim=1) @ F.normalize(txt, dim=1).T
    out = {}
    for name, s, m in (("i2t", sims, i_match), ("t2i", sims.T, i_match.T)):
        order = torch.argsort(s, dim=1, descending=True)
        hit_sorted = torch.gather(m, 1, order)
        first = torch.where(hit_sorted.any(1), hit_sorted.float().argmax(1), torch.tensor(10 ** 9))
        for k in (1, 5, 10):
            out[f"{name}_r{k}"] = 100.0 * float((first < k).float().mean())
    return out


def test_identity_embeddings_score_100():
    n = 30
    r = recall_at_k(torch.eye(n), torch.eye(n), torch.arange(n))
    assert all(r[k] == 100.0 for k in KEYS)
    assert r["r1_sum"] == 200.0 and r["rsum"] == 600.0


@pytest.mark.parametrize("rank", [0, 3, 7, 12])
def test_circulant_case_puts_every_match_at_a_known_rank(rank):
    # img_i = e_i; caption j's similarity to image i is v[(i - j + rank) mod n] (v strictly decreasing),
    # so in both directions every true match has exactly `rank` better items.
    n = 20
    v = torch.linspace(1.0, 0.1, n)
    i = torch.arange(n)
    txt = v[(i[None, :] - i[:, None] + rank) % n]  # row j = caption j
    r = recall_at_k(torch.eye(n), txt, torch.arange(n))
    for k in (1, 5, 10):
        want = 100.0 if rank < k else 0.0
        assert r[f"i2t_r{k}"] == want and r[f"t2i_r{k}"] == want


def test_two_captions_per_image():
    # caption 2i = e_i (exact); caption 2i+1 = e_{i+1} + 0.5 e_i: its own image is 2nd for it.
    n = 12
    e = torch.eye(n)
    txt = torch.stack([row for i in range(n) for row in (e[i], e[(i + 1) % n] + 0.5 * e[i])])
    t2i = torch.arange(n).repeat_interleave(2)
    r = recall_at_k(e, txt, t2i)
    assert r["i2t_r1"] == r["i2t_r5"] == 100.0  # the exact caption is each image's best
    assert r["t2i_r1"] == 50.0 and r["t2i_r5"] == 100.0
    assert r["r1_sum"] == 150.0 and r["rsum"] == 550.0


def test_random_matches_argsort_reference_with_uneven_captions():
    g = torch.Generator().manual_seed(0)
    n, d = 40, 8
    img = torch.randn(n, d, generator=g)
    t2i = torch.cat([torch.arange(n), torch.randint(0, n, (50,), generator=g)])  # 1-3ish captions each
    txt = img[t2i] + 0.9 * torch.randn(t2i.numel(), d, generator=g)
    want = reference(img, txt, torch.arange(n)[:, None] == t2i[None, :])
    got = recall_at_k(img, txt, t2i)
    assert 0 < got["i2t_r1"] < 100 and 0 < got["t2i_r1"] < 100
    for k in KEYS:
        assert got[k] == pytest.approx(want[k])


def test_chunked_equals_unchunked():
    g = torch.Generator().manual_seed(1)
    img = torch.randn(50, 6, generator=g)
    t2i = torch.arange(50).repeat_interleave(3)
    txt = img[t2i] + torch.randn(150, 6, generator=g)
    a = recall_at_k(img, txt, t2i, chunk=7)
    b = recall_at_k(img, txt, t2i, chunk=100_000)
    assert a == b


def test_ties_count_against_the_query():
    # a collapsed model: every embedding equal -> no retrieval credit
    r = recall_at_k(torch.ones(20, 4), torch.ones(20, 4), torch.arange(20))
    assert r["i2t_r1"] == 0.0 and r["t2i_r10"] == 0.0


def test_one_k_protocol_is_the_mean_of_five_folds_and_rsum_authors():
    g = torch.Generator().manual_seed(2)
    n, d = 5000, 16  # 5,000 pairs, captions in a shuffled order
    img = torch.randn(n, d, generator=g)
    t2i = torch.randperm(n, generator=g)
    txt = img[t2i] + 1.0 * torch.randn(n, d, generator=g)
    out = evaluate_retrieval(img, txt, t2i)  # auto -> 1k
    assert out["protocol"] == "1k"
    folds = []
    for f in range(5):
        sel = (t2i >= 1000 * f) & (t2i < 1000 * (f + 1))
        folds.append(recall_at_k(img[1000 * f:1000 * (f + 1)], txt[sel], t2i[sel] - 1000 * f))
    for k in [*KEYS, "r1_sum", "rsum"]:
        assert out[k] == pytest.approx(sum(r[k] for r in folds) / 5)
    full = evaluate_retrieval(img, txt, t2i, protocol="plain")
    assert full["protocol"] == "plain" and "rsum_authors" not in full
    for k in KEYS:
        assert out[f"5k_{k}"] == pytest.approx(full[k])
    assert out["i2t_r1"] > out["5k_i2t_r1"]  # 1K folds are easier than 5K
    assert out["rsum_authors"] == pytest.approx(out["i2t_r1"] + out["t2i_r1"] + full["i2t_r1"] + full["t2i_r1"])


def test_fifths_protocol_is_strided_folds_plus_the_whole_set():
    """The small-set analogue of 1K + 5K (CreamFL's Table 1 "R@1_sum"): fold f = images i % 5 == f
    with their captions, fold means under fold_*, the whole set under the plain keys, and
    rsum_authors the four-term sum; rows sorted by class still give every fold every class."""
    g = torch.Generator().manual_seed(4)
    n, d = 403, 8  # not a multiple of 5; two captions for some images
    img = torch.randn(n, d, generator=g)
    t2i = torch.cat([torch.arange(n), torch.randint(0, n, (57,), generator=g)])
    txt = img[t2i] + 1.2 * torch.randn(t2i.numel(), d, generator=g)
    out = evaluate_retrieval(img, txt, t2i, protocol="fifths")
    assert out["protocol"] == "fifths"
    full = recall_at_k(img, txt, t2i)
    for k in [*KEYS, "r1_sum", "rsum"]:
        assert out[k] == pytest.approx(full[k])
    folds = []
    for f in range(5):
        keep = torch.arange(f, n, 5)
        sel = (t2i % 5) == f
        i_match = t2i[sel][None, :] == keep[:, None]  # caption j of the fold is a hit for image keep[i]
        folds.append(reference(img[keep], txt[sel], i_match))
    for k in KEYS:
        assert out[f"fold_{k}"] == pytest.approx(sum(r[k] for r in folds) / 5)
    assert out["fold_i2t_r1"] > out["i2t_r1"]  # a fifth of the gallery is easier than all of it
    assert out["rsum_authors"] == pytest.approx(out["fold_i2t_r1"] + out["fold_t2i_r1"] + out["i2t_r1"]
                                                + out["t2i_r1"])
    with pytest.raises(ValueError, match="fifths"):
        evaluate_retrieval(torch.eye(3), torch.eye(3), torch.arange(3), protocol="fifths")


def test_retrieval_scores_of_one_pair_per_row_report_the_papers_four_term_r1_sum():
    from types import SimpleNamespace

    from mmfl.core.evaluation import retrieval_scores
    from mmfl.data.base import ArrayDataset

    labels = torch.arange(40) // 4  # sorted by class, like mfeat's and emoji's test rows
    test = ArrayDataset({"image": torch.zeros(40, 1)}, labels)
    g = torch.Generator().manual_seed(5)
    img = torch.randn(40, 6, generator=g)
    txt = img + 0.8 * torch.randn(40, 6, generator=g)
    out = retrieval_scores(img, txt, test, SimpleNamespace(info={"pairing": "instance"}, num_classes=10))
    want = evaluate_retrieval(img, txt, torch.arange(40), protocol="fifths")
    assert out["rsum_authors"] == pytest.approx(want["rsum_authors"])
    assert out["r1_sum"] == pytest.approx(want["i2t_r1"] + want["t2i_r1"])  # the two-term, one-gallery figure
    assert "class_i2t_r1" in out


def test_auto_is_plain_off_5000_and_1k_needs_5000():
    out = evaluate_retrieval(torch.eye(10), torch.eye(10), torch.arange(10))
    assert out["protocol"] == "plain" and out["r1_sum"] == 200.0
    with pytest.raises(ValueError, match="5000"):
        evaluate_retrieval(torch.eye(10), torch.eye(10), torch.arange(10), protocol="1k")
    with pytest.raises(ValueError, match="protocol"):
        evaluate_retrieval(torch.eye(10), torch.eye(10), torch.arange(10), protocol="5k")


def test_class_level():
    g = torch.Generator().manual_seed(3)
    il = torch.randint(0, 3, (30,), generator=g)
    tl = torch.randint(0, 3, (45,), generator=g)
    centres = torch.eye(3) * 5
    img = centres[il] + 0.3 * torch.randn(30, 3, generator=g)
    txt = centres[tl] + 0.3 * torch.randn(45, 3, generator=g)
    out = evaluate_retrieval(img, txt, class_level=True, img_labels=il, txt_labels=tl)
    assert all(out[k] == 100.0 for k in KEYS)
    # noisy: equals the argsort reference with "same label" as the hit rule
    img, txt = torch.randn(30, 3, generator=g), torch.randn(45, 3, generator=g)
    got = evaluate_retrieval(img, txt, class_level=True, img_labels=il, txt_labels=tl)
    want = reference(img, txt, il[:, None] == tl[None, :])
    for k in KEYS:
        assert got[k] == pytest.approx(want[k])
    # a label with no item on the other side is never a hit, even with fewer items than K
    r = recall_at_k(torch.eye(3), torch.eye(3)[:2], img_labels=torch.tensor([0, 1, 2]),
                    txt_labels=torch.tensor([0, 1]))
    assert r["i2t_r10"] == pytest.approx(200 / 3)
    with pytest.raises(ValueError, match="img_labels"):
        evaluate_retrieval(img, txt, class_level=True)


def test_pairs_to_retrieval_dedupes_images_in_first_seen_order():
    image = torch.tensor([[9.0], [9.0], [4.0], [7.0], [4.0]])
    text = torch.arange(5.0)[:, None]
    img, txt, t2i = pairs_to_retrieval(image, text, torch.tensor([30, 30, 10, 20, 10]))
    assert img[:, 0].tolist() == [9.0, 4.0, 7.0]
    assert t2i.tolist() == [0, 0, 1, 2, 1] and torch.equal(txt, text)


def test_bad_inputs():
    with pytest.raises(ValueError, match="txt_to_img"):
        recall_at_k(torch.eye(3), torch.eye(3), torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="same d"):
        recall_at_k(torch.eye(3), torch.eye(4), torch.arange(4))
