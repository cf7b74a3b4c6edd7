"""Federated algorithms, one module per family, registered by name.

``ALGORITHMS.get(name).factory`` is an :class:`~mmfl.algorithms.base.AlgorithmSpec`
(server class, client class, flags); ``.params`` is its typed parameter
dataclass (the ``[algorithm]`` table of a config).
"""

from mmfl.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")


def register(name: str, params: type | None, server, client, help: str, **flags):
    from mmfl.algorithms.base import AlgorithmSpec

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


from mmfl.algorithms import centralized, fedavg, fedprox, local, moon, multimodal, scaffold  # noqa: E402,F401  (register)
from mmfl.algorithms import fedcmi, fedmsplit, fedogm, prototypes  # noqa: E402,F401  (register; after multimodal)
from mmfl.algorithms import creamfl, partialfl  # noqa: E402,F401  (register)
from mmfl.algorithms import split, fedfomo, fedamp, pfedwireless  # noqa: E402,F401  (register; after multimodal)
