"""The algorithm registry: ``register`` (an algorithm module calls it at import) and
``preset`` (a registered variant with other defaults). :mod:`mmfl.algorithms` imports every
algorithm module, so ``ALGORITHMS`` is complete once that package is imported."""

from __future__ import annotations

from mmfl.algorithms.base import AlgorithmSpec
from mmfl.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")


def register(name: str, params: type | None, server, client, help: str, **flags):
    ALGORITHMS.register(name, params, help=help)(AlgorithmSpec(server, client, **flags))


def preset(name: str, base: type, **defaults) -> type:
    """A params dataclass like ``base`` with other defaults (a registered variant such as
    ``reamfl_mean`` = CreamFL's params with ``aggregation = "mean"``); types and help texts
    are ``base``'s, so ``mmfl list`` shows them alike."""
    import typing
    from dataclasses import field, make_dataclass

    hints = typing.get_type_hints(base)
    fields = [(k, hints[k], field(default=v, metadata=base.__dataclass_fields__[k].metadata))
              for k, v in defaults.items()]
    return make_dataclass(name, fields, bases=(base,), namespace={"__module__": base.__module__})
