"""``torch.optim.SGD`` and ``torch.optim.Adam`` without the ``torch._dynamo`` import.

The first call of a few ``torch.optim.Optimizer`` methods (``add_param_group`` in the constructor,
``zero_grad``, ``step``, ``state_dict``) imports ``torch._dynamo`` through ``torch._disable_dynamo``
or ``_use_grad_for_differentiable``: 1.0-1.5 s of CPU once per process (most of a short run, a
sweep's job or a Flower client process; ``benchmarks/results/fixed_costs.md`` measures it). Those
decorators only matter under ``torch.compile``, which mmfl does not use.

:class:`SGD` and :class:`Adam` are subclasses of torch's classes (``isinstance(opt,
torch.optim.Optimizer)`` holds; ``param_groups``, ``state``, ``defaults``, hooks and
``state_dict()`` are torch's) whose decorated methods call torch's own undecorated function
(``__wrapped__``) under ``torch.no_grad()``, as the decorator does when not compiling. The update
arithmetic is therefore torch's, step for step: parameters are bit-identical to ``torch.optim``'s
(``tests/test_optim.py``).
"""

from __future__ import annotations

import inspect

import torch

_Base = torch.optim.Optimizer


def _raw(fn):
    """The function under torch's decorators (``functools.wraps`` keeps it in ``__wrapped__``)."""
    return inspect.unwrap(fn)


_add_param_group = _raw(_Base.add_param_group)
_zero_grad = _raw(_Base.zero_grad)
_state_dict = _raw(_Base.state_dict)
_load_state_dict = _raw(_Base.load_state_dict)


class _NoDynamo:
    """The ``torch.optim.Optimizer`` methods whose first call imports ``torch._dynamo``, undecorated."""

    def add_param_group(self, param_group) -> None:
        _add_param_group(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _zero_grad(self, set_to_none)

    def state_dict(self):
        return _state_dict(self)

    def load_state_dict(self, state_dict) -> None:
        _load_state_dict(self, state_dict)


def _step(torch_class):
    raw = _raw(torch_class.step)

    def step(self, closure=None):
        with torch.no_grad():  # what _use_grad_for_differentiable sets (differentiable = False)
            return raw(self, closure)

    step.__doc__ = f"``torch.optim.{torch_class.__name__}.step`` without its ``torch._dynamo`` graph breaks."
    return step


class SGD(_NoDynamo, torch.optim.SGD):
    """``torch.optim.SGD`` (same arguments and results) that does not import ``torch._dynamo``."""

    step = _step(torch.optim.SGD)


class Adam(_NoDynamo, torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments and results) that does not import ``torch._dynamo``."""

    step = _step(torch.optim.Adam)
