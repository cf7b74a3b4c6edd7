"""Sample-level DP-SGD in a client's local training (``[dp] mode = "sample"``, docs/dp.md).

DP-SGD (Abadi et al., CCS 2016, Algorithm 1) as Opacus implements it (``opacus==1.6.0``):

- **sampling** (:func:`poisson_batches`): every step keeps each of the client's n rows independently
  with probability q = min(1, B / n) (B: ``train.batch_size``), Opacus's
  ``UniformWithReplacementSampler``; ``ceil(n / B)`` steps per local epoch. The draws come from the
  client's seeded generator (``ctx.generator()``), so a run and its resume draw the same batches.
- **per-sample gradients**: Opacus's ``GradSampleHooks`` (the hooks of ``GradSampleModule``, attached
  to the model without wrapping it) fill ``p.grad_sample`` ``[b, *p.shape]`` on backward of the
  summed per-sample loss (:class:`per_sample_gradients`).
- **clip and noise** (:func:`clip_and_noise`, Alg. 1 lines 6-8): each sample's gradient (all
  parameters flattened together) is scaled by ``min(1, C / (||g_i|| + 1e-6))``, the scaled gradients
  are summed, ``N(0, (z C)^2)`` is added per coordinate and the sum divided by the expected batch
  size q n. That is ``DPOptimizer.clip_and_accumulate`` / ``add_noise`` / ``scale_grad`` (with
  ``secure_mode`` off) written as one function, because a term of the parameters alone (FedProx's
  proximal term) is added after it, un-clipped; the test compares it with ``DPOptimizer``.
- **accounting** (:func:`record_steps`, :func:`history_epsilon`): each client keeps Opacus's
  ``RDPAccountant`` history ``[(z, q, steps), ...]`` in its persistent state, and epsilon at delta
  comes from that accountant.

The neighbouring relation is adding or removing one sample of one client's data; each client's
epsilon covers the models it sends (post-processing of the noisy gradients).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Iterator

import torch
from torch import Tensor, nn

from mmfl.data.base import ArrayDataset
from mmfl.core.training import make_optimizer

# a batch's loss per sample: (model, inputs, labels [b]) -> [b]; each entry must depend on its own sample only
SampleLoss = Callable[[nn.Module, dict[str, Tensor], Tensor], Tensor]
# a term of the parameters alone (FedProx's proximal term): (model) -> scalar, or None
Penalty = Callable[[nn.Module], Tensor | None]


def sample_rate(n: int, batch_size: int) -> float:
    """q = min(1, B / n): each row's probability of being in a step's batch (expected size B)."""
    return min(1.0, batch_size / max(n, 1))


def steps_per_epoch(n: int, batch_size: int) -> int:
    """``ceil(n / B)``: the steps of one local epoch (one expected pass over the data)."""
    return max(1, math.ceil(n / batch_size))


def poisson_batches(n: int, rate: float, steps: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Row positions of ``steps`` Poisson-sampled batches of ``range(n)``: each row is kept with
    probability ``rate``, independently per row and step (``torch.rand(n) < rate``, as Opacus's
    ``UniformWithReplacementSampler``). A batch may be empty. Drawn on the CPU (``generator`` is a
    CPU generator: the same batches on every device); the positions are CPU tensors."""
    for _ in range(steps):
        yield (torch.rand(n, generator=generator, device="cpu") < rate).nonzero().reshape(-1)


def clip_and_noise(grad_samples: list[Tensor], clip_norm: float, noise_multiplier: float,
                   expected_batch_size: float, generator: torch.Generator | None) -> list[Tensor]:
    """DP-SGD's private gradient from per-sample gradients (Abadi et al. 2016, Alg. 1 lines 6-8).

    ``grad_samples``: one ``[b, *shape]`` tensor per parameter (b may be 0). Each sample i's norm
    ``||g_i||`` is taken over all parameters together; the result per parameter is
    ``(sum_i g_i min(1, C / (||g_i|| + 1e-6)) + N(0, (z C)^2 I)) / expected_batch_size``, of
    ``shape``. The noise is drawn parameter by parameter with ``torch.normal`` from ``generator``
    (no draw when z C = 0): Opacus's ``DPOptimizer`` computes the same, draw for draw. The noise is
    drawn on the CPU (``generator`` is a CPU generator: the same noise on every device) and moved
    to the gradients' device."""
    if grad_samples[0].shape[0] == 0:
        factor = grad_samples[0].new_zeros((0,))
    else:
        norms = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in grad_samples], dim=1).norm(2, dim=1)
        factor = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    std = noise_multiplier * clip_norm
    out = []
    for g in grad_samples:
        summed = torch.einsum("i,i...", factor.to(g.dtype), g)
        if std > 0:
            noise = torch.normal(mean=0, std=std, size=summed.shape, generator=generator, dtype=summed.dtype,
                                 device="cpu")
            summed = summed + noise.to(summed.device)
        out.append(summed / expected_batch_size)
    return out


class per_sample_gradients:
    """``with per_sample_gradients(model):`` Opacus's ``GradSampleHooks`` attached to ``model`` (loss
    reduction "sum", batch first), so each backward fills ``p.grad_sample`` ``[b, *p.shape]``;
    removed on exit (the model is a pooled instance other clients reuse)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self):
        from opacus.grad_sample.grad_sample_module import GradSampleHooks  # only DP-SGD runs import opacus

        self.hooks = GradSampleHooks(self.model, batch_first=True, loss_reduction="sum", strict=True)
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        # torch's note that the first layer's full backward hook sees no input gradient (inputs are data)
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        return self.hooks

    def __exit__(self, *exc):
        self.warnings.__exit__(*exc)
        self.hooks.cleanup()  # hooks removed, grad_sample and Opacus's other parameter attributes deleted
        for m in self.model.modules():
            m.__dict__.pop("activations", None)  # what the forward hooks kept of the last batch
        return False


def model_blocker(model: nn.Module) -> str | None:
    """Why DP-SGD cannot train ``model`` (one line naming the module), or None.

    Per-sample gradients need every sample's output to depend on that sample only, and no state
    learnt from the data outside the parameters: Opacus's ``ModuleValidator`` (BatchNorm, LSTM, ...)
    and ``GradSampleHooks.validate`` (a trainable module with buffers) name what breaks that."""
    from opacus.grad_sample.grad_sample_module import GradSampleHooks
    from opacus.validators import ModuleValidator

    for name, m in model.named_modules():  # every module: a BatchNorm without affine parameters mixes samples too
        check = ModuleValidator.VALIDATORS.get(type(m))
        errors = check(m) if check is not None else []
        if errors or any(True for _ in m.buffers(recurse=False)):
            if "BatchNorm" in type(m).__name__:
                why = "its batch statistics mix the samples of a batch"
            elif errors:  # Opacus's message, its first sentence
                why = str(errors[0]).strip().splitlines()[0].split(". ")[0].rstrip(".")
            else:
                why = "it keeps buffers, state outside the parameters"
            return f"{type(m).__name__} at '{name or '<model>'}' ({why})"
    errors = GradSampleHooks.validate(model, strict=False)  # Opacus's own check of the trainable modules
    if errors:
        return str(errors[0]).strip().splitlines()[0]
    return None


def dp_loop(model: nn.Module, n: int, train, epochs: int | None = None) -> tuple[float, int, list, object]:
    """What a DP-SGD loop over ``n`` rows starts from: the sample rate q, the number of steps
    (:func:`steps_per_epoch` x ``epochs`` or ``train.local_epochs``), the trainable parameters and
    ``train``'s optimizer over them; the model in train mode."""
    q = sample_rate(n, train.batch_size)
    steps = steps_per_epoch(n, train.batch_size) * (epochs or train.local_epochs)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return q, steps, params, make_optimizer(params, train)


def dpsgd_train(model: nn.Module, data: ArrayDataset, train, clip_norm: float, noise_multiplier: float,
                generator: torch.Generator, noise_generator: torch.Generator, sample_loss: SampleLoss,
                penalty: Penalty | None = None, epochs: int | None = None) -> dict:
    """DP-SGD on ``data`` for ``train.local_epochs`` epochs of :func:`steps_per_epoch` Poisson batches
    (:func:`poisson_batches` from ``generator``), each step's gradient :func:`clip_and_noise` of the
    per-sample gradients of ``sample_loss`` (noise from ``noise_generator``) plus the gradient of
    ``penalty(model)`` (a term of the parameters alone, not clipped or noised: it reads no data),
    then ``train``'s optimizer step (SGD with momentum / weight decay, or Adam: post-processing).

    Returns ``train_loss`` (mean per-sample loss over the rows drawn), ``steps``, ``sample_rate`` q."""
    n = len(data)
    q, steps, params, opt = dp_loop(model, n, train, epochs)
    total, seen = 0.0, 0
    with per_sample_gradients(model):
        for rows in poisson_batches(n, q, steps, generator):
            opt.zero_grad(set_to_none=True)
            for p in params:
                p.grad_sample = None
            if rows.numel():
                inputs, labels = data.get(rows.to(data.labels.device))
                losses = sample_loss(model, inputs, labels)  # [b]
                losses.sum().backward()
                samples = [p.grad_sample if p.grad_sample is not None else p.new_zeros((len(rows), *p.shape))
                           for p in params]
                total += losses.detach().sum().double()  # summed on the device: no sync per step
                seen += len(rows)
            else:  # an empty Poisson batch: the step is noise alone
                samples = [p.new_zeros((0, *p.shape)) for p in params]
            grads = clip_and_noise(samples, clip_norm, noise_multiplier, q * n, noise_generator)
            pen = penalty(model) if penalty is not None else None
            if pen is not None:
                extra = torch.autograd.grad(pen, params, allow_unused=True)
                grads = [g if e is None else g + e for g, e in zip(grads, extra)]
            for p, g in zip(params, grads):
                p.grad = g.view_as(p)
            opt.step()
        for p in params:
            p.grad_sample = None
    return {"train_loss": float(total) / max(seen, 1), "steps": steps, "sample_rate": q}


# ----------------------------------------------------------------------------- accounting

def record_steps(history: Tensor | None, noise_multiplier: float, rate: float, steps: int) -> Tensor:
    """Opacus's ``RDPAccountant.history`` as a float64 tensor ``[m, 3]`` of rows (z, q, steps), with
    ``steps`` more steps at (z, q) added: to the last row when it has the same z and q (as
    ``RDPAccountant.step`` merges them), else as a new row."""
    row = torch.tensor([[float(noise_multiplier), float(rate), float(steps)]], dtype=torch.float64,
                       device=history.device if history is not None else "cpu")
    if history is None or history.numel() == 0:
        return row
    history = history.clone()
    if history[-1, 0] == row[0, 0] and history[-1, 1] == row[0, 1]:
        history[-1, 2] += row[0, 2]
        return history
    return torch.cat([history, row])


def history_epsilon(history: Tensor | None, delta: float) -> float:
    """Epsilon at ``delta`` of a :func:`record_steps` history by Opacus's RDP accountant
    (``RDPAccountant`` with that history, its default orders). No steps: 0; z = 0 in any row: inf."""
    if history is None or history.numel() == 0:
        return 0.0
    rows = [(float(z), float(q), int(s)) for z, q, s in history.tolist()]
    if any(z <= 0 for z, _, _ in rows):
        return math.inf
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = rows
    return float(acc.get_epsilon(delta=delta))
