"""Batched clients: the sampled clients of a round trained together.

When every client of a ``send`` shares one architecture, their local training runs
as one computation over *stacked* parameters: each parameter becomes a tensor
``[K, *shape]`` (one row per client), the model runs once per step through
``torch.func.vmap(functional_call)`` on the clients' mini-batches stacked to
``[K, B, ...]``, one backward gives every client's gradient (client ``k``'s
loss depends only on row ``k``), and the optimizer updates all rows at once: SGD
(momentum, weight decay) or Adam, each client's optimizer state a row of the stack
(:mod:`mmfl.core.batched_optim`). Client ``k`` sees exactly what sequential training
would give it: the same shuffling (its own seeded generator), the same batches, the same
loss and the same update rule, so results equal sequential training within
float tolerance (summation order inside the kernels differs; not bit for bit).

What an algorithm provides (:class:`BatchedClient`, a capability its client
class declares): the start state and per-client extras of a message
(:meth:`~BatchedClient.batched_task`), a per-sample loss of one client
(``(forward, params, inputs, labels, extras, shared) -> [B]``), an optional
per-client penalty (FedProx's proximal term), optional gradient and step hooks
(SCAFFOLD's correction after each step) and how to turn the trained state into the reply
(:meth:`~BatchedClient.batched_finish`). FedAvg (and FedAvgM, FedDyn), FedProx, SCAFFOLD, MOON and SOLO (``local``)
implement it.

Unequal client sizes: clients are ordered by their number of steps (longest
first); at step ``t`` only the clients with more than ``t`` steps are active,
a prefix of the stack, so a client that has finished is neither computed nor
updated (no masked-out work). A client's last, short batch is padded to the
longest batch of the step with zero-weight rows (the per-sample loss is
averaged over its real rows only). Batches of one sample are skipped, as in
:func:`~mmfl.core.training.local_train`.

BatchNorm: buffers are stacked like parameters (one row per client), so each client's
running statistics are its own and ``vmap`` updates them in place; its batch statistics
are those of the client's own batch. Padding rows would enter them, so a model with
BatchNorm takes one step per distinct batch width (clients whose last batch is short step
apart). Frozen reference models (MOON's global and previous model) run in eval mode
(``forward(params, inputs, False)``), as in sequential training.

Where batching cannot apply the transport trains the clients one by one, and
says so once in the log (logger ``mmfl``) and in every round's metrics row
(``batched_fallback``): active dropout (its random masks differ from
sequential training), recurrent encoders, optimizers other than SGD and Adam, clients whose start states
differ in shape, and algorithms without the capability.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from mmfl.core.batched_optim import OPTIMIZERS, make_stacked_optimizer, state_copies
from mmfl.core.message import Message
from mmfl.core.training import shuffled_batches


MAX_GROUP = 128  # clients per stack: bounds the stacked parameters, optimizer state and activations
MEMORY_FRACTION = 0.8  # an accelerator's stack may use this share of its free memory
Forward = Callable[[dict[str, Tensor], dict[str, Tensor]], dict[str, Tensor]]


@dataclass
class BatchedTask:
    """One client's part of a batched group.

    start: the model state to train from (``state_dict`` names).
    extras: per-client tensors (or dicts of tensors) the loss, penalty and
        gradient hook read; stacked over the group, so every client of a group
        has the same keys and shapes.
    shared: values equal for every client of the group (taken from the first).
    group: clients are batched only with clients of the same group key
        (e.g. MOON: with or without a previous model).
    """

    start: dict[str, Tensor]
    extras: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    group: Any = None


class BatchedClient:
    """Capability: a client class whose local training can run batched.

    ``self`` is a client built for one message (with its ``ctx``); the loss,
    penalty and hook of a group are taken from its first client and must
    depend on the run's algorithm parameters only, never on ``self.ctx``:
    everything per client goes through ``extras``.
    """

    batched_routes: tuple[str, ...] = ("train",)  # the routes tried batched; others go one by one, silently

    def batched_task(self, route: str, msg: Message) -> BatchedTask | None:
        """The task for ``msg`` on ``route``, or None to train this message sequentially."""
        return None

    def batched_loss(self, forward: Forward, params: dict[str, Tensor], inputs: dict[str, Tensor],
                     labels: Tensor, extras: dict[str, Any], shared: dict[str, Any]) -> Tensor:
        """Per-sample loss ``[B]`` of ONE client (the engine vmaps it over the group).

        ``forward(params, inputs)`` runs the model; ``params`` are this
        client's (differentiable) parameters.
        """
        raise NotImplementedError

    def batched_penalty(self, params: dict[str, Tensor], extras: dict[str, Any],
                        shared: dict[str, Any]) -> Tensor | None:
        """A per-client term added to the mean loss (a scalar), or None."""
        return None

    def batched_grad_hook(self, grads: dict[str, Tensor], extras: dict[str, Any]) -> dict[str, Tensor]:
        """Change the stacked gradients ``[k, *shape]`` before each step (extras stacked alike)."""
        return grads

    def batched_step_hook(self, params: dict[str, Tensor], extras: dict[str, Any]) -> None:
        """Change the stacked parameters ``[k, *shape]`` in place after each step (SCAFFOLD)."""

    def batched_finish(self, route: str, msg: Message, state: dict[str, Tensor], stats: dict) -> Message:
        """The reply (and ``self.ctx.state`` update) after training ended at ``state``."""
        raise NotImplementedError


# ----------------------------------------------------------------------------- applicability

def model_blocker(model: nn.Module, train) -> str | None:
    """Why this model/optimizer cannot be trained batched, or None."""
    if train.optimizer not in OPTIMIZERS:
        return f"optimizer '{train.optimizer}' (batched training implements SGD and Adam)"
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return "the model uses dropout (its random masks would differ from sequential training)"
        if isinstance(m, nn.RNNBase):
            return "the model has a recurrent (GRU) encoder (torch.func.vmap has no rule for it)"
    return None


# ----------------------------------------------------------------------------- how many clients to stack

def stack_size(per_client_bytes: int, free_bytes: int | None, limit: int = MAX_GROUP,
               fraction: float = MEMORY_FRACTION) -> int:
    """Clients per stack: as many as ``fraction`` of ``free_bytes`` holds at ``per_client_bytes``
    each, between 1 and ``limit`` (``free_bytes`` None: unknown, ``limit``)."""
    if free_bytes is None or per_client_bytes <= 0:
        return limit
    return max(1, min(limit, int(fraction * free_bytes) // per_client_bytes))


def client_bytes(task: BatchedTask, train, activation_bytes: int = 0) -> int:
    """Device memory one stacked client needs: its parameters, gradients and optimizer state
    (SGD's momentum, Adam's two moments; ``[K, *shape]`` rows of each), its per-client extras
    (e.g. MOON's two reference models, SCAFFOLD's control variates) and ``activation_bytes``
    (one batch's forward and backward, measured by :func:`probe_activation_bytes`)."""
    params = sum(t.numel() * t.element_size() for t in task.start.values())
    copies = 2 + state_copies(train)  # parameters, gradients, optimizer state

    def size(tree) -> int:
        if isinstance(tree, dict):
            return sum(size(v) for v in tree.values())
        return tree.numel() * tree.element_size() if isinstance(tree, Tensor) else 0

    return copies * params + size(task.extras) + activation_bytes


def probe_activation_bytes(model: nn.Module, data, batch_size: int, device: torch.device) -> int:
    """Peak device memory of one client's forward and backward on one batch of ``data``
    (CUDA only: the allocator's peak statistic; 0 elsewhere)."""
    if device.type != "cuda" or len(data) == 0:
        return 0
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    inputs, labels = data.get(torch.arange(min(batch_size, len(data)), device="cpu"))
    out = model(inputs)["logits"]
    torch.nn.functional.cross_entropy(out, labels).backward()
    model.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated(device) - before
    return int(max(peak, 0) * 1.5)  # headroom: vmap's batched kernels keep a few more buffers


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an accelerator running out of memory."""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


# ----------------------------------------------------------------------------- the step schedule

def client_batches(data, batch_size: int, epochs: int, generator: torch.Generator) -> list[Tensor]:
    """The row indices (into the shared feature tensors, on the CPU) of every local step of one
    client, in order: the batches :func:`~mmfl.core.training.local_train` would draw."""
    base = data.indices.cpu() if data.indices is not None else None  # one copy, not one per step
    return [base[rows] if base is not None else rows
            for rows in shuffled_batches(len(data), batch_size, generator, epochs, keep_single=True)]


def step_plan(schedules: list[list[Tensor]]) -> tuple[Tensor, Tensor, list[list[int]]]:
    """Every step's row indices and weights for a stack, built on the CPU in one pass (so an
    accelerator gets two copies per stack, not a few small ones per client and step):
    ``idx [T, K, W]`` (a short batch padded with its first row), ``weights [T, K, W]`` (1 on
    real rows, 0 on padding) and ``widths[t][j]``, the real batch size of stack row ``j`` at
    step ``t`` (clients in stack order; those with fewer steps are left out of later steps)."""
    t_max = max((len(s) for s in schedules), default=0)
    w_max = max((r.shape[0] for s in schedules for r in s), default=1)
    idx = torch.zeros(t_max, len(schedules), w_max, dtype=torch.long, device="cpu")
    weights = torch.zeros(t_max, len(schedules), w_max, device="cpu")
    widths: list[list[int]] = [[] for _ in range(t_max)]
    for j, sched in enumerate(schedules):
        for t, r in enumerate(sched):
            n = r.shape[0]
            idx[t, j, :n] = r
            idx[t, j, n:] = r[0]
            weights[t, j, :n] = 1
            widths[t].append(n)
    return idx, weights, widths


def _stack(trees: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for k, v in trees[0].items():
        out[k] = _stack([t[k] for t in trees]) if isinstance(v, dict) else torch.stack([t[k] for t in trees])
    return out


def _select(tree: dict[str, Any], sel) -> dict[str, Any]:
    """The stack rows ``sel`` (a slice or an index tensor) of every tensor of ``tree``."""
    return {k: _select(v, sel) if isinstance(v, dict) else v[sel] for k, v in tree.items()}


def train_stacked(model: nn.Module, client: BatchedClient, tasks: list[BatchedTask], datas: list,
                  generators: list[torch.Generator], train, epochs: int | None = None
                  ) -> list[tuple[dict[str, Tensor], dict]]:
    """Local training (SGD or Adam) of K clients at once. Returns ``(final state, stats)`` per client, in input order.

    ``model`` is a template of the shared architecture (its own weights are not used).
    """
    k_all = len(tasks)
    epochs = epochs or train.local_epochs
    schedules = [client_batches(d, train.batch_size, epochs, g) for d, g in zip(datas, generators)]
    steps = [len(s) for s in schedules]
    order = sorted(range(k_all), key=lambda i: -steps[i])  # longest first: the active set is a prefix
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    names = list(tasks[0].start)
    stacked = {n: torch.stack([tasks[i].start[n].detach() for i in order]).clone() for n in names}
    extras = _stack([tasks[i].extras for i in order]) if tasks[0].extras else {}
    shared = tasks[0].shared
    opt = make_stacked_optimizer(stacked, trainable, train)  # fresh, as local_train's optimizer
    device = next(iter(stacked.values())).device
    totals = torch.zeros(k_all, dtype=torch.float64, device=device)
    same_source = all(d.features is datas[0].features and d.labels is datas[0].labels for d in datas)

    batch_stats = any(isinstance(mod, _BatchNorm) for mod in model.modules())
    model.train()

    def forward(params, inputs, training: bool = True):
        """The model on one client's ``params`` (parameters and buffers); ``training=False``
        runs it in eval mode (a frozen reference model: BatchNorm reads its running statistics)."""
        if training:
            return functional_call(model, params, (inputs,))
        model.eval()
        try:
            return functional_call(model, params, (inputs,))
        finally:
            model.train()

    def client_loss(params, inputs, labels, weights, ex):
        per = client.batched_loss(forward, params, inputs, labels, ex, shared)
        loss = (per * weights).sum() / weights.sum()
        pen = client.batched_penalty(params, ex, shared)
        return loss if pen is None else loss + pen

    vloss = vmap(client_loss)

    def step(sel, rows, idx: Tensor, weights: Tensor) -> None:
        """One optimizer step of the stack rows ``sel`` (a slice: views, updated in place; an
        index tensor: gathered, updated, written back; ``rows``: ``sel`` on the CPU) on their
        batches' rows ``idx [k, width]``."""
        k, width = idx.shape
        if same_source:
            flat = idx.reshape(-1)
            inputs = {mod: t_[flat].view(k, width, *t_.shape[1:]) for mod, t_ in datas[0].features.items()}
            labels = datas[0].labels[flat].view(k, width)
        else:
            members = range(k) if isinstance(sel, slice) else sel.tolist()
            got = [datas[order[j]] for j in members]
            inputs = {mod: torch.stack([got[j].features[mod][idx[j]] for j in range(k)]) for mod in got[0].features}
            labels = torch.stack([got[j].labels[idx[j]] for j in range(k)])
        if labels.device != device:  # data kept in host memory (it did not fit on the device)
            inputs = {mod: t_.to(device, non_blocking=True) for mod, t_ in inputs.items()}
            labels = labels.to(device, non_blocking=True)
        part = {n: stacked[n][sel] for n in names}  # views for a slice, copies for an index
        ex = _select(extras, sel)
        leaves = {n: part[n].detach().requires_grad_(n in trainable) for n in names}
        losses = vloss(leaves, inputs, labels, weights, ex)  # BatchNorm updates the buffer leaves in place
        grads = torch.autograd.grad(losses.sum(), [leaves[n] for n in trainable], allow_unused=True)
        with torch.no_grad():
            gd = {n: g for n, g in zip(trainable, grads) if g is not None}
            gd = client.batched_grad_hook(gd, ex)
            opt.step(sel, rows, part, gd)  # its state rows are written back by the optimizer
            client.batched_step_hook({n: part[n] for n in trainable}, ex)
            if not isinstance(sel, slice):  # write the gathered rows back
                for n in names:  # parameters stepped in part; buffers updated in place through leaves
                    stacked[n][sel] = part[n]
            totals[sel] += losses.detach().double()

    idx_all, w_all, widths_all = step_plan([schedules[i] for i in order])
    data_device = datas[0].labels.device
    idx_all, w_all = idx_all.to(data_device), w_all.to(device)  # once per stack
    for t, widths in enumerate(widths_all):
        m, width = len(widths), max(widths)  # the active clients are a prefix (longest first)
        if not batch_stats or len(set(widths)) == 1:
            step(slice(0, m), slice(0, m), idx_all[t, :m, :width], w_all[t, :m, :width])
        else:  # BatchNorm's batch statistics must not see padding rows: one step per batch width
            for w in sorted(set(widths), reverse=True):
                js = torch.tensor([j for j in range(m) if widths[j] == w], device="cpu")
                step(js.to(device), js, idx_all[t, js.to(data_device), :w], w_all[t, js.to(device), :w])
    out: list = [None] * k_all
    totals = totals.tolist()  # one device sync for the group
    for j, i in enumerate(order):
        state = {n: stacked[n][j].clone() for n in names}
        out[i] = (state, {"train_loss": totals[j] / max(steps[i], 1), "steps": steps[i]})
    return out


# hooks only the sequential path calls (mmfl.algorithms.base.TrainingClient); a subclass that
# overrides one of them without also providing batched_* methods would be batched with its
# parent's objective. (The FedAvg family's objective/penalty/references/finish/after_train
# serve both paths.)
_TRAINING_METHODS = ("handle", "train", "load_model", "begin", "loss_fn", "loss", "on_epoch",
                     "before_step", "after_step")


def capability_blocker(cls: type) -> str | None:
    """Why ``cls`` (a client class) cannot be batched, or None."""
    if not issubclass(cls, BatchedClient):
        return f"{cls.__name__} does not declare the BatchedClient capability"
    for klass in cls.__mro__:
        if any(k.startswith("batched_") for k in vars(klass)):
            return None
        changed = [m for m in _TRAINING_METHODS if m in vars(klass)]
        if changed:
            return (f"{klass.__name__} overrides {', '.join(changed)} but not the batched_* methods "
                    "of BatchedClient")
    return f"{cls.__name__} does not implement the BatchedClient methods"
