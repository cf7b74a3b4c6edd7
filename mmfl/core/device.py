"""The run's device and precision (``device``, ``precision`` in the config).

Everything a run computes lives on one device: models, optimizer state, data batches and
every tensor a loss or an aggregation creates. Code that creates a tensor names its device
explicitly (``device=`` of a tensor it already has, or the context's ``device``); nothing
relies on torch's default device (``tests/test_device.py`` runs every algorithm with the
default device set to ``meta`` to catch one that does).

What stays on the CPU on purpose: the seeded shuffling generators (so a client draws the
same batches on every device), checkpoints and the disk state store (device-independent:
a run checkpointed on a GPU resumes on a CPU and vice versa), and messages on Flower's wire.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from torch import Tensor

from mmfl.errors import ConfigError

CPU = torch.device("cpu")


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` of a ``device`` setting: ``auto`` is ``cuda`` where a CUDA GPU is
    visible, else ``mps`` where Apple's is, else ``cpu``; an explicit accelerator that this
    machine lacks is a ConfigError (one line), not a silent CPU run."""
    if isinstance(name, torch.device):
        return name
    name = str(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if _mps_available():
            return torch.device("mps")
        return CPU
    if name == "cpu":
        return CPU
    if name == "mps":
        if not _mps_available():
            raise ConfigError("device: 'mps' requested but this machine has no usable Apple GPU "
                              "(torch.backends.mps.is_available() is False); use device = \"auto\" or \"cpu\"")
        return torch.device("mps")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ConfigError(f"device: {name!r} requested but {why} (torch {torch.__version__}); "
                              "use device = \"auto\" or \"cpu\"")
        index = int(name.split(":", 1)[1]) if ":" in name else torch.cuda.current_device()
        if not 0 <= index < torch.cuda.device_count():
            raise ConfigError(f"device: {name!r} requested but this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")
        return torch.device("cuda", index)
    raise ConfigError(f"device: must be auto, cpu, cuda, cuda:N or mps, got {name!r}")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def describe(device: torch.device) -> str:
    """``cuda:0 (NVIDIA H100 80GB HBM3)``, ``cpu``: for logs and benchmark tables."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def to_device(tree: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Every tensor of a (nested dict / list / tuple) ``tree`` on ``device`` (no copy where it
    already is)."""
    if isinstance(tree, Tensor):
        return tree if tree.device == device else tree.to(device, non_blocking=non_blocking and device.type == "cuda")
    if isinstance(tree, dict):
        return {k: to_device(v, device, non_blocking) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_device(v, device, non_blocking) for v in tree)
    return tree


def to_cpu(tree: Any) -> Any:
    """:func:`to_device` to the CPU (synchronous): what is written to disk or to the wire."""
    return to_device(tree, CPU, non_blocking=False)


def precision_context(device: torch.device, precision: str = "fp32"):
    """The context the run computes in: ``bf16`` is ``torch.autocast`` to bfloat16 on the run's
    device (weights, gradients and optimizer state stay fp32; each op casts the current weights,
    no cache); ``fp32`` does nothing."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        # no weight cache: the context spans whole rounds (many optimizer steps), and autocast's
        # cache would keep serving the bf16 copy of a weight from before its updates (a model that
        # stops learning; tests/test_device_engine.py checks it learns as in fp32)
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=False)
    raise ConfigError(f"precision: must be 'fp32' or 'bf16', got {precision!r}")


def to_fp32(arrays: dict[str, Tensor]) -> dict[str, Tensor]:
    """bf16 tensors that autocast produced (e.g. representations) back to fp32, so a message's
    schema and byte count do not depend on ``precision``."""
    return {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in arrays.items()}


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` now (CUDA: ``torch.cuda.mem_get_info``; CPU: the OS's available
    memory where it says), or None where unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (timing on an accelerator)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


DATA_MEMORY_FRACTION = 0.5  # data is kept on an accelerator when it takes at most this share of its free memory


def place_federation(federation, device: torch.device, fraction: float = DATA_MEMORY_FRACTION):
    """``federation`` (an :class:`~mmfl.data.base.Federation`) for a run on ``device``: on the CPU
    as it is; on an accelerator its tensors are moved there once when they fit in ``fraction``
    of the free device memory, else they stay in host memory and each batch is moved (one
    line on stderr says so)."""
    if device.type == "cpu":
        return federation
    need, free = federation.nbytes(), free_memory(device)
    keep = free is None or need <= fraction * free
    if not keep:
        import sys

        print(f"mmfl: note: the data ({need / 2**30:.2f} GiB) does not fit in {fraction:.0%} of {describe(device)}'s "
              f"free memory ({free / 2**30:.2f} GiB); it stays in host memory and each batch is copied",
              file=sys.stderr, flush=True)
    return federation.to(device, keep=keep)


def fp32_message(msg):
    """``msg`` (a :class:`~mmfl.core.message.Message`) with the bf16 arrays that autocast left in
    it cast to fp32 (the same object where there are none): what crosses between server and
    clients does not depend on ``precision``, and a side computing in fp32 can read it."""
    if any(t.dtype == torch.bfloat16 for t in msg.arrays.values()):
        return type(msg)(to_fp32(msg.arrays), msg.scalars)
    return msg


def fp32_messages(messages: dict) -> dict:
    """:func:`fp32_message` of every message of ``{cid: Message}`` (a server's send)."""
    return {cid: fp32_message(msg) for cid, msg in messages.items()}
