"""Federated algorithms, one module per family, registered by name.

``ALGORITHMS.get(name).factory`` is an :class:`~mmfl.algorithms.base.AlgorithmSpec`
(server class, client class, flags); ``.params`` is its typed parameter
dataclass (the ``[algorithm]`` table of a config).
"""

import importlib
import pkgutil

from mmfl.algorithms.registry import ALGORITHMS, preset, register  # noqa: F401  (the package's API)


def _register_in_tree() -> None:
    """Import every module of this package (alphabetically): each registers its algorithms
    when imported, so a new algorithm file needs no line here."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")


_register_in_tree()
