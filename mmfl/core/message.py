"""Messages: all that crosses between server and clients.

A :class:`Message` is named tensors plus named scalars, the same shape as a
Flower ``Message`` with an ``ArrayRecord`` and a ``ConfigRecord``/
``MetricRecord``, so an algorithm runs unchanged on either transport.

Byte accounting counts the payload exactly: ``numel * element_size`` of each
tensor, 8 bytes per numeric or boolean scalar, and the UTF-8 length of each
string scalar. Names are not counted (every transport ships them once per
message; they are negligible next to the tensors and would make the count
depend on naming style).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

Scalar = float | int | bool | str


@dataclass
class Message:
    arrays: dict[str, Tensor] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)

    def nbytes(self) -> int:
        return tensor_bytes(self.arrays) + scalar_bytes(self.scalars)

    def nonfinite_key(self) -> str | None:
        """Name of the first array or scalar holding NaN/inf, else None."""
        for k, t in self.arrays.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return k
        for k, v in self.scalars.items():
            if isinstance(v, float) and not math.isfinite(v):
                return k
        return None


def tensor_bytes(arrays: dict[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in arrays.values())


def scalar_bytes(scalars: dict[str, Scalar]) -> int:
    return sum(len(v.encode()) if isinstance(v, str) else 8 for v in scalars.values())
