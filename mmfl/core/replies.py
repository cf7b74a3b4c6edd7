"""Reply schemas: what a server expects a client's reply to hold, and the check of a reply
against it (run by the engine before any server code sees the reply, see
:meth:`mmfl.engine.simulation.CommLog.admit`).

A server declares its schema per route and client (:meth:`mmfl.algorithms.base.Server.reply_schema`);
the default, for the ``train`` route of a weight-averaging algorithm, is derived from the
model (:func:`model_schema`): the arrays a client may send are the model's state entries
of the modalities it holds, with the server's shapes and dtypes, and ``num_examples`` is a
positive integer. An algorithm adds its own arrays (``extra``: exact shapes; ``free``: key
prefixes of any shape) or declares no schema for a route (nothing checked but NaN/inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch
from torch import Tensor

from mmfl.core.message import Message

Spec = tuple[tuple[int, ...], torch.dtype]  # (shape, dtype)

# the bound on a count scalar when the client's data size is unknown (no real client has more rows)
MAX_COUNT = 2 ** 31 - 1


@dataclass(frozen=True)
class ReplySchema:
    """What a reply may and must hold.

    - ``arrays``: the keys a reply may carry, each with its exact ``(shape, dtype)``; a reply
      may carry any subset (a client holding some modalities sends those modules only).
    - ``free``: key prefixes a reply may also carry, of any shape and dtype (an algorithm's
      own tensors whose shape varies, e.g. per-class prototypes).
    - ``counts``: scalars that must be present, each a positive integer at most the client's
      data size (``num_examples``: the aggregation weight).
    - ``count_prefixes``: scalars named ``<prefix>...`` that, when present, are integers in
      ``[0, data size]`` (a module's own data weight, ``examples/<module>``).
    - ``required``: array keys every reply must carry (SCAFFOLD's control-variate updates).
    """

    arrays: Mapping[str, Spec] = field(default_factory=dict)
    free: tuple[str, ...] = ()
    counts: tuple[str, ...] = ("num_examples",)
    count_prefixes: tuple[str, ...] = ("examples/",)
    required: tuple[str, ...] = ()
    min_arrays: int = 0  # of ``arrays``' keys a reply must carry (a model reply: 1, model_schema)

    def merge(self, extra: "ReplySchema | None") -> "ReplySchema":
        """This schema with ``extra``'s arrays, free prefixes and required keys added (its counts
        are this schema's)."""
        if extra is None:
            return self
        return ReplySchema({**self.arrays, **dict(extra.arrays)}, self.free + tuple(extra.free), self.counts,
                           self.count_prefixes, self.required + tuple(extra.required), self.min_arrays)


def specs_of(tensors: Mapping[str, Tensor]) -> dict[str, Spec]:
    """``{key: (shape, dtype)}`` of named tensors (a model's state dict)."""
    return {k: (tuple(t.shape), t.dtype) for k, t in tensors.items()}


def model_schema(server_state: Mapping[str, Tensor], client_keys=None) -> ReplySchema:
    """The default schema of a weight-averaging algorithm's ``train`` reply: entries of
    ``server_state`` (the global model's state dict) restricted to ``client_keys`` (the
    entries the client's own model has, e.g. only its modalities' modules; None: all),
    shapes and dtypes equal to the server's; ``num_examples`` required, and at least one model
    entry (a reply without any would count its ``num_examples`` for nothing)."""
    specs = specs_of(server_state)
    if client_keys is not None:
        keys = set(client_keys)
        specs = {k: v for k, v in specs.items() if k in keys}
    return ReplySchema(specs, min_arrays=1 if specs else 0)


def _count(value, name: str, low: int, high: int) -> str | None:
    """Why ``value`` is not an integer in ``[low, high]`` (None: it is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"scalar '{name}' must be an integer, got {value!r}"
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return f"scalar '{name}' must be an integer, got {value!r}"
    if not low <= value <= high:
        return f"scalar '{name}' = {value:g} is outside [{low}, {high}]"
    return None


def check_reply(schema: ReplySchema, reply: Message, data_size: int | None = None) -> str | None:
    """Why ``reply`` does not fit ``schema`` (one line), or None when it does.

    ``data_size``: the client's number of training rows when known, the upper bound of its
    count scalars (else :data:`MAX_COUNT`). Checks, in order: every array key is allowed,
    with the declared shape and dtype; every array is finite; every required count is
    present and in ``[1, data_size]``; every per-module count in ``[0, data_size]``; every
    numeric scalar is finite.
    """
    if not isinstance(reply, Message):
        return f"reply is a {type(reply).__name__}, not a Message"
    high = MAX_COUNT if data_size is None else int(data_size)
    for key, t in reply.arrays.items():
        if not isinstance(t, Tensor):
            return f"array '{key}' is a {type(t).__name__}, not a tensor"
        spec = schema.arrays.get(key)
        if spec is None:
            if not any(key.startswith(p) for p in schema.free):
                return f"unexpected array '{key}'"
        else:
            shape, dtype = spec
            if tuple(t.shape) != tuple(shape):
                return f"array '{key}' has shape {list(t.shape)}, expected {list(shape)}"
            if t.dtype != dtype:
                return f"array '{key}' has dtype {t.dtype}, expected {dtype}"
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            return f"array '{key}' holds NaN/inf"
    for key in schema.required:
        if key not in reply.arrays:
            return f"array '{key}' is missing"
    if schema.min_arrays and sum(k in schema.arrays for k in reply.arrays) < schema.min_arrays:
        return "the reply carries no model array (none of the model's entries)"
    for name in schema.counts:
        if name not in reply.scalars:
            return f"scalar '{name}' is missing"
        why = _count(reply.scalars[name], name, 1, high)
        if why:
            return why
    for name, value in reply.scalars.items():
        if name not in schema.counts and any(name.startswith(p) for p in schema.count_prefixes):
            why = _count(value, name, 0, high)
            if why:
                return why
        elif isinstance(value, float) and not math.isfinite(value):
            return f"scalar '{name}' is {value}"
    return None
