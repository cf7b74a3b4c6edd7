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


from mmfl.algorithms import centralized, fedavg, fedprox, local, moon, multimodal, scaffold  # noqa: E402,F401  (register)
from mmfl.algorithms import fedcmi, fedmsplit, fedogm, prototypes  # noqa: E402,F401  (register; after multimodal)
from mmfl.algorithms import creamfl, partialfl  # noqa: E402,F401  (register)
from mmfl.algorithms import split, fedfomo, fedamp, pfedwireless  # noqa: E402,F401  (register; after multimodal)
