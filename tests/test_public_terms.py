"""CreamFL's global-local contrastive aggregation, chunked: equals the full-matrix
computation of the authors' code on small sizes, and is checked by hand on tiny ones."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms.public_terms import (aggregate_representations, global_local_contrastive_aggregation,
                                          global_local_contrastive_scores, global_local_contrastive_weights)


def naive_scores(local, glob, exclude_positive=False):
    """The authors' code: diag(log_softmax(local @ global.T)) per client, the full matrix."""
    out = []
    for c in range(local.shape[0]):
        logits = local[c] @ glob.T
        if exclude_positive:
            pos = logits.diag().clone()
            logits.fill_diagonal_(float("-inf"))
            out.append(pos - torch.logsumexp(logits, 1))
        else:
            out.append(F.log_softmax(logits, dim=1).diag())
    return torch.stack(out)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
@pytest.mark.parametrize("exclude_positive", [False, True])
def test_chunked_scores_equal_the_full_matrix(chunk, exclude_positive):
    g = torch.Generator().manual_seed(0)
    local = F.normalize(torch.randn(3, 50, 16, generator=g), dim=-1)
    glob = F.normalize(torch.randn(50, 16, generator=g), dim=-1)
    got = global_local_contrastive_scores(local, glob, chunk=chunk, exclude_positive=exclude_positive)
    assert got.shape == (3, 50)
    assert torch.allclose(got, naive_scores(local, glob, exclude_positive), atol=1e-5)


def test_aggregation_equals_naive_for_both_modalities():
    g = torch.Generator().manual_seed(1)
    li, lt = torch.randn(4, 33, 8, generator=g), torch.randn(2, 33, 8, generator=g)
    gi, gt = torch.randn(33, 8, generator=g), torch.randn(33, 8, generator=g)
    img, txt = global_local_contrastive_aggregation(li, gt, lt, gi, chunk=5)
    a = torch.softmax(naive_scores(li, gt), 0)  # softmax over clients per sample (eq. 5)
    assert torch.allclose(img, (a.unsqueeze(-1) * li).sum(0), atol=1e-5)  # eq. 6
    b = torch.softmax(naive_scores(lt, gi), 0)
    assert torch.allclose(txt, (b.unsqueeze(-1) * lt).sum(0), atol=1e-5)


def test_scores_by_hand():
    # P = 2, d = 1: client reps [1, 0] vs global [1, 2]: logits row k=0: [1, 2]; row k=1: [0, 0]
    local = torch.tensor([[[1.0], [0.0]]])
    glob = torch.tensor([[1.0], [2.0]])
    s = global_local_contrastive_scores(local, glob)
    assert s[0, 0].item() == pytest.approx(1 - math.log(math.e + math.e ** 2))
    assert s[0, 1].item() == pytest.approx(0 - math.log(2))
    s_paper = global_local_contrastive_scores(local, glob, exclude_positive=True)
    assert s_paper[0, 0].item() == pytest.approx(1 - 2)  # log(e^1 / e^2)
    # two clients with equal scores get equal weights; weights sum to one per sample
    w = global_local_contrastive_weights(torch.tensor([[0.0, 1.0], [0.0, 3.0]]))
    assert torch.allclose(w.sum(0), torch.ones(2))
    assert w[0, 0].item() == pytest.approx(0.5) and w[1, 1].item() == pytest.approx(1 / (1 + math.e ** -2))
    agg = aggregate_representations(torch.tensor([[[2.0]], [[4.0]]]), torch.tensor([[0.25], [0.75]]))
    assert agg.item() == pytest.approx(3.5)


def test_shape_errors():
    with pytest.raises(ValueError, match="global_other"):
        global_local_contrastive_scores(torch.zeros(2, 5, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="global_img"):
        global_local_contrastive_aggregation(torch.zeros(1, 2, 3), torch.zeros(2, 3), torch.zeros(1, 2, 3))


def fresh_temporaries_scores(local, glob, chunk, exclude_positive=False, candidates=None):
    """eq. 4 chunked as before issue 28: a fresh logits matrix (and exponentials) per chunk."""
    C, P, _ = local.shape
    out = torch.empty(C, P)
    for c in range(C):
        for s in range(0, P, chunk):
            e = min(P, s + chunk)
            logits = local[c, s:e] @ glob.t()
            positive = (local[c, s:e] * glob[s:e]).sum(-1)
            if exclude_positive:
                logits[torch.arange(e - s), torch.arange(s, e)] = float("-inf")
            if candidates is not None:
                logits = logits.masked_fill(~candidates.unsqueeze(0), float("-inf"))
            out[c, s:e] = positive - torch.logsumexp(logits, dim=1)
            if candidates is not None:
                out[c, s:e].masked_fill_(~candidates[s:e], 0.0)
    return out


@pytest.mark.parametrize("exclude_positive", [False, True])
@pytest.mark.parametrize("with_candidates", [False, True])
def test_the_reused_buffer_gives_the_same_bits(exclude_positive, with_candidates):
    g = torch.Generator().manual_seed(2)
    local, glob = torch.randn(3, 777, 32, generator=g), 3 * torch.randn(777, 32, generator=g)
    cand = torch.rand(777, generator=g) > 0.3 if with_candidates else None
    for chunk in (100, 1024):
        want = fresh_temporaries_scores(local, glob, chunk, exclude_positive, cand)
        assert torch.equal(global_local_contrastive_scores(local, glob, chunk, exclude_positive, cand), want)


def _kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_one_logits_buffer_for_every_chunk():
    # issue 28 item 7: the chunk x P logits are one buffer written in place (out=, in-place exp), not a
    # fresh matrix plus its exponentials per chunk: the peak extra memory is about one buffer
    g = torch.Generator().manual_seed(3)
    P, chunk = 12000, 1024
    local, glob = torch.randn(2, P, 16, generator=g), torch.randn(P, 16, generator=g)
    buffer_kb = chunk * P * 4 / 1024
    global_local_contrastive_scores(local, glob, chunk)  # warm: the allocator's own arenas
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _kb("VmRSS")
    global_local_contrastive_scores(local, glob, chunk)
    assert _kb("VmHWM") - before < 1.5 * buffer_kb
