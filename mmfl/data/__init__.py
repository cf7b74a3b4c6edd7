"""Data sets, the generic manifest format, partitioners and :class:`Federation`.

Registries are defined before the loader modules are imported, because those
modules register themselves into them.
"""

from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta, Federation
from mmfl.registry import Registry

# factory(params) -> DatasetBundle
DATASETS: Registry = Registry("dataset")
# factory(labels: np.ndarray, params, rng: np.random.Generator, client_ids: np.ndarray | None) -> list[np.ndarray]
PARTITIONERS: Registry = Registry("partition")

__all__ = ["ArrayDataset", "DatasetBundle", "DatasetMeta", "Federation", "DATASETS", "PARTITIONERS"]
from mmfl.data import partition  # noqa: E402,F401  (registers partitioners)
from mmfl.data import idx, mfeat, sklearn_digits, cifar, manifest, avmnist, crema_d  # noqa: E402,F401  (register)
from mmfl.data import ag_news, captions, featurize, featurize_image, emoji, text_cls, mnist_pix  # noqa: E402,F401  (register)
from mmfl.data import food101  # noqa: E402,F401  (registers food101)
