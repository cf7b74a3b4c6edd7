"""Stacked Adam (mmfl.core.batched_optim): every row of the stack is torch's Adam for one client,
with its own moments and step count, also when rows step in different groups or a parameter has
no gradient at a step. (Training equal to sequential: tests/test_batched.py, ``opt = adam``.)"""

from __future__ import annotations

import torch

from mmfl.config import TrainConfig
from mmfl.core import optim
from mmfl.core.batched_optim import StackedAdam, make_stacked_optimizer


def test_every_row_is_torch_adam_with_its_own_step_count():
    torch.manual_seed(0)
    k, shapes = 3, {"w": (4, 5), "b": (4,)}
    start = {n: torch.randn(k, *s) for n, s in shapes.items()}
    stacked = {n: t.clone() for n, t in start.items()}
    opt = make_stacked_optimizer(stacked, list(shapes), TrainConfig(optimizer="adam", lr=0.05, weight_decay=0.01))
    assert isinstance(opt, StackedAdam)
    refs = []  # one torch Adam per client, as local_train makes it
    for j in range(k):
        params = {n: start[n][j].clone().requires_grad_(True) for n in shapes}
        refs.append((params, optim.Adam(list(params.values()), lr=0.05, weight_decay=0.01)))
    # which rows step (a slice: the active prefix; an index: one BatchNorm width group) and which
    # parameters have a gradient; rows end at different step counts (w: 4, 3, 2; b: 3, 2, 2)
    plan = [(slice(0, 3), ["w", "b"]), (torch.tensor([0, 2]), ["w", "b"]), (slice(0, 2), ["w"]),
            (torch.tensor([1]), ["w", "b"]), (slice(0, 1), ["w", "b"])]
    for sel, have in plan:
        rows = range(k)[sel] if isinstance(sel, slice) else sel.tolist()
        grads_all = {n: torch.randn(len(rows), *shapes[n]) for n in have}
        part = {n: stacked[n][sel] for n in shapes}
        opt.step(sel, sel, part, grads_all)
        if not isinstance(sel, slice):
            for n in shapes:
                stacked[n][sel] = part[n]
        for i, j in enumerate(rows):
            params, ref = refs[j]
            ref.zero_grad(set_to_none=True)
            for n in have:
                params[n].grad = grads_all[n][i].clone()
            ref.step()
    assert opt.steps.tolist() == [[4, 3, 2], [3, 2, 2]]  # [parameter, client]
    for j, (params, ref) in enumerate(refs):
        for n in shapes:
            assert torch.equal(stacked[n][j], params[n].detach()), (j, n)  # bit for bit on the CPU
            assert int(ref.state[params[n]]["step"]) == opt.steps[list(shapes).index(n), j]
            assert torch.allclose(opt.exp_avg_sq[n][j], ref.state[params[n]]["exp_avg_sq"], rtol=0, atol=1e-7)
