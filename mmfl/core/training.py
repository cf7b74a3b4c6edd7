"""Local training and evaluation loops shared by the algorithms.

Algorithms change *what* is minimised (a loss function of the batch) and may
touch gradients before each step (SCAFFOLD); the loop itself lives here once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.core import optim
from mmfl.core.patterns import PatternCounter
from mmfl.data.base import PRESENT, ArrayDataset

LossFn = Callable[[nn.Module, dict[str, Tensor], Tensor], Tensor]


def masked_ce(logits: Tensor, labels: Tensor, mask: Tensor | None, reduction: str = "mean") -> Tensor:
    """Cross-entropy over the rows where ``mask`` is True (all rows if None); 0 if none."""
    if mask is None or bool(mask.all()):
        return F.cross_entropy(logits, labels, reduction=reduction)
    if not bool(mask.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[mask], labels[mask], reduction=reduction)


def cross_entropy_loss(model: nn.Module, inputs: dict[str, Tensor], labels: Tensor) -> Tensor:
    """Cross-entropy of the output; a multimodal model given ``present/<m>`` masks: over the rows
    holding at least one modality (``out["any_present"]``)."""
    out = model(inputs)
    return masked_ce(out["logits"], labels, out.get("any_present"))


def cosine_lr(lr: float, rnd: int, period: int, lr_min: float = 0.0) -> float:
    """Cosine annealing over rounds: ``lr_min + (lr - lr_min) (1 + cos(pi min(r, T) / T)) / 2``
    in 0-based round ``r`` with period ``T`` (``lr`` in round 0; torch's ``CosineAnnealingLR``
    with ``T_max = T`` stepped once per round, as CreamFL's authors step their server's)."""
    t = min(max(rnd, 0), period)
    return lr_min + (lr - lr_min) * (1.0 + math.cos(math.pi * t / period)) / 2.0


def train_for_run(train, rounds: int):
    """``train`` with the cosine period resolved (``lr_rounds = 0`` means the run's rounds)."""
    if train.lr_schedule == "constant" or train.lr_rounds:
        return train
    return dataclasses.replace(train, lr_rounds=rounds)


def train_at_round(train, rnd: int):
    """The round's training settings: ``train`` with ``lr`` from its schedule (the engine hands
    every client of round ``rnd`` this, so SCAFFOLD's ``(x - y) / (K lr)`` uses the same lr)."""
    if train.lr_schedule == "constant":
        return train
    if train.lr_rounds < 1:
        raise ValueError("train.lr_rounds is unresolved; pass the run's train through train_for_run")
    return dataclasses.replace(train, lr=cosine_lr(train.lr, rnd, train.lr_rounds, train.lr_min))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate (a persistent optimizer under a schedule)."""
    for group in opt.param_groups:
        group["lr"] = lr


def make_optimizer(params, train) -> torch.optim.Optimizer:
    """``train``'s optimizer: ``torch.optim.SGD`` / ``Adam`` as :mod:`mmfl.core.optim` gives them
    (the same arithmetic, without the 1-1.5 s ``torch._dynamo`` import of a process's first one)."""
    if train.optimizer == "adam":
        return optim.Adam(params, lr=train.lr, weight_decay=train.weight_decay)
    return optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)


_ACCELERATORS: bool | None = None


def seed_torch(seed: int) -> None:
    """Seed torch's global RNG (dropout, ...) like ``torch.manual_seed``, cheaply.

    On a machine without accelerators ``torch.manual_seed`` also queues a lazy
    CUDA/XPU/MTIA seeding call holding a formatted stack trace, about 1-3 ms per
    call and a queue that grows by one entry per message; only the CPU generator
    matters there, so only it is seeded (the same random stream).
    """
    global _ACCELERATORS
    if _ACCELERATORS is None:
        _ACCELERATORS = bool(torch.cuda.is_available() or torch.backends.mps.is_available()
                             or (hasattr(torch, "xpu") and torch.xpu.is_available()))
    if _ACCELERATORS:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)



def shuffled_batches(n: int, batch_size: int, generator: torch.Generator, epochs: int = 1,
                     keep_single: bool = False) -> Iterator[Tensor]:
    """Row positions ``[b]`` of every mini-batch of ``epochs`` passes over ``range(n)``, each a
    fresh ``randperm`` from ``generator`` (drawn as the pass starts) cut into batches of
    ``batch_size``. A batch of one row is skipped (BatchNorm), unless ``keep_single`` and the
    data has a single row (:func:`local_train`'s rule)."""
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator, device="cpu")  # a CPU generator: the same rows on every device
        for s in range(0, n, batch_size):
            rows = order[s:s + batch_size]
            if rows.numel() < 2 and not (keep_single and n < 2):
                continue
            yield rows


def local_train(
    model: nn.Module,
    data: ArrayDataset,
    train,
    generator: torch.Generator,
    loss_fn: LossFn = cross_entropy_loss,
    after_step: Callable[[], None] | None = None,
    epochs: int | None = None,
    before_step: Callable[[], None] | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """SGD on ``data`` for ``train.local_epochs`` epochs. Hooks: ``on_epoch(e)`` at the start
    of each epoch (PMR's prototypes), ``before_step()`` between backward and the optimizer
    step (gradient modulation, OGM-GE), ``after_step()`` after every optimizer step
    (SCAFFOLD). Returns the mean loss and the number of steps."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, train)
    # the loss summed on the device in float64 (the same sum as Python floats), read once at the
    # end: a float() per step would wait for an accelerator at every step
    total, steps = torch.zeros((), dtype=torch.float64, device=params[0].device if params else "cpu"), 0
    for epoch in range(epochs or train.local_epochs):
        if on_epoch is not None:
            on_epoch(epoch)
        for inputs, labels in data.batches(train.batch_size, shuffle=True, generator=generator):
            if labels.shape[0] < 2 and len(data) >= 2:
                continue  # a batch of one breaks BatchNorm; MOON's loaders drop it too
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, inputs, labels)
            loss.backward()
            if before_step is not None:
                before_step()
            opt.step()
            if after_step is not None:
                after_step()
            total += loss.detach()
            steps += 1
    return {"train_loss": float(total) / max(steps, 1), "steps": steps}


@torch.no_grad()
def evaluate_model(model: nn.Module, data: ArrayDataset, batch_size: int = 1000,
                   num_classes: int | None = None) -> dict:
    """Top-1 accuracy (and top-5, ``accuracy_top5``, with more than 5 classes) and mean
    cross-entropy of ``model`` on ``data``.

    For a multimodal model (outputs ``mod_logits``) also, per modality ``m``:
    ``accuracy/<m>`` (that modality's own head), and for the joint output and
    each modality: ``uar`` / ``uar/<m>`` (unweighted average recall = macro
    recall, as fed-multimodal reports) and ``class_accuracy`` /
    ``class_accuracy/<m>`` (recall of each class, a list; NaN -> None for a
    class absent from ``data``). The numbers that reveal modality imbalance.
    """
    model.eval()
    correct, top5, loss, n = 0, 0, 0.0, 0
    preds: dict[str, list[Tensor]] = {}
    ys: list[Tensor] = []
    held: dict[str, list[Tensor]] = {}  # per modality: which rows hold it (only where a mask says)
    patterns = PatternCounter(data.modalities) if any(k.startswith(PRESENT) for k in data.features) else None
    for inputs, labels in data.batches(batch_size, shuffle=False):
        out = model(inputs)
        logits = out["logits"]
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        hit = logits.argmax(1) == labels
        correct += int(hit.sum())
        if patterns is not None:
            patterns.add(inputs, hit)
        if logits.shape[1] > 5:
            top5 += int((logits.topk(5, dim=1).indices == labels.unsqueeze(1)).any(1).sum())
        n += labels.shape[0]
        if "mod_logits" in out:
            ys.append(labels)
            preds.setdefault("", []).append(logits.argmax(1))
            for m, lg in out["mod_logits"].items():
                preds.setdefault(m, []).append(lg.argmax(1))
                held.setdefault(m, []).append(out["present"][m] if "present" in out and PRESENT + m in inputs
                                              else torch.ones_like(labels, dtype=torch.bool))
    row: dict = {"accuracy": correct / max(n, 1), "test_loss": loss / max(n, 1)}
    if n and logits.shape[1] > 5:  # top-5 means something only with more than 5 classes
        row["accuracy_top5"] = top5 / n
    if patterns is not None:  # a set whose rows may lack modalities: accuracy by missingness pattern
        row.update(patterns.metrics())
    if ys:
        y_all = torch.cat(ys)
        k = num_classes or int(y_all.max()) + 1
        for m, ps in preds.items():
            suffix = f"/{m}" if m else ""
            p, y = torch.cat(ps), y_all
            if m:  # a modality's own head: scored on the rows that hold m only
                rows = torch.cat(held[m])
                if not bool(rows.all()):
                    p, y = p[rows], y[rows]
                    if not int(rows.sum()):
                        continue
            if m:
                row[f"accuracy{suffix}"] = float((p == y).double().mean())
            recall = class_recall(p, y, k)
            row[f"uar{suffix}"] = float(torch.tensor([r for r in recall if r is not None], device="cpu").mean())
            row[f"class_accuracy{suffix}"] = recall
    return row


def class_recall(pred: Tensor, y: Tensor, num_classes: int) -> list[float | None]:
    """Recall of each class (None for a class with no sample)."""
    hits = torch.bincount(y[pred == y], minlength=num_classes).double()
    count = torch.bincount(y, minlength=num_classes).double()
    return [float(h / c) if c > 0 else None for h, c in zip(hits.tolist(), count.tolist())]


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The model's own parameter and buffer tensors by state-dict name, cached on the model.

    ``state_dict()``/``load_state_dict()`` walk every submodule in Python (about
    2 ms for MOON's CNN); the engine loads and copies models for every message,
    so it keeps this flat map instead (models are not restructured after
    construction).
    """
    cache = model.__dict__.get("_mmfl_tensors")
    if cache is None:
        cache = dict(model.state_dict(keep_vars=True))
        model.__dict__["_mmfl_tensors"] = cache
    return cache


def state_of(model: nn.Module) -> dict[str, Tensor]:
    """A detached copy of the model's state dict (parameters and buffers)."""
    return {k: v.detach().clone() for k, v in model_tensors(model).items()}


def load_into(model: nn.Module, arrays: dict[str, Tensor], prefix: str = "") -> nn.Module:
    """Load ``arrays`` (optionally those under ``prefix``) into ``model`` in place.

    Same result as ``model.load_state_dict(sd, strict=True)``; a mismatch in
    names or shapes goes to ``load_state_dict`` for its error message.
    """
    sd = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)} if prefix else arrays
    own = model_tensors(model)
    if sd.keys() != own.keys() or any(own[k].shape != v.shape for k, v in sd.items()):
        model.load_state_dict(sd, strict=True)
        return model
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(sd[k])
    return model
