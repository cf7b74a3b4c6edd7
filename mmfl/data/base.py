"""In-memory data containers shared by every loader, partitioner and algorithm.

A sample has one tensor per *modality* (``"image"``, ``"audio"``, ``"pix"``,
...) and an integer label. Loaders return a :class:`DatasetBundle` (train and
test :class:`ArrayDataset` plus :class:`DatasetMeta`); partitioners split the
train labels into per-client index lists; :class:`Federation` ties it
together. Client sets are index views on the shared train tensors, so 10,000
clients cost 10,000 index arrays, not 10,000 copies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

PRESENT = "present/"  # features["present/<m>"]: bool [N], False where a sample lacks modality m
# features["length/<m>"]: int64 [N], the valid length (last axis) of a padded sequence modality m
LENGTH = "length/"
AUX_PREFIXES = (PRESENT, LENGTH)


def is_modality(key: str) -> bool:
    """True for a modality key, False for a per-sample auxiliary key (``present/<m>``, ``length/<m>``)."""
    return not key.startswith(AUX_PREFIXES)


@dataclass
class ArrayDataset:
    """Samples as tensors: ``features[m]: [N, *shape_m]``, ``labels: [N]`` (int64).

    ``indices`` (optional, int64 ``[n]``) makes this a view on the rows of the
    shared tensors: ``len(self) == n`` and :meth:`get` gathers those rows.
    ``device`` (optional): where :meth:`get` puts the rows it gathers, for a data set kept in
    host memory that the run's device could not hold (:meth:`to` with ``keep=False``); a set
    already on the run's device leaves it None.
    """

    features: dict[str, Tensor]
    labels: Tensor
    indices: Tensor | None = None
    device: torch.device | None = None

    def __post_init__(self):
        n = self.labels.shape[0]
        for m, t in self.features.items():
            if t.shape[0] != n:
                raise ValueError(f"modality {m!r} has {t.shape[0]} rows, labels have {n}")

    def __len__(self) -> int:
        return int(self.indices.numel()) if self.indices is not None else int(self.labels.shape[0])

    @property
    def modalities(self) -> list[str]:
        """The modalities this set holds (aux keys ``present/<m>``, ``length/<m>`` excluded)."""
        return [k for k in self.features if is_modality(k)]

    def with_features(self, keys) -> "ArrayDataset":
        """The same rows with only the feature tensors named in ``keys`` (no copy), plus the
        ``length/<m>`` of every kept modality ``m`` that has one (a padded sequence keeps its
        valid lengths; ``present/<m>`` masks are kept only where ``keys`` names them)."""
        keys = list(keys)
        keys += [LENGTH + k for k in keys if is_modality(k) and LENGTH + k in self.features and LENGTH + k not in keys]
        return ArrayDataset({k: self.features[k] for k in keys}, self.labels, self.indices, self.device)

    def subset(self, idx) -> "ArrayDataset":
        """A view on rows ``idx`` (positions within this dataset)."""
        idx = torch.as_tensor(np.asarray(idx), dtype=torch.long, device=self.labels.device)
        base = self.indices[idx] if self.indices is not None else idx
        return ArrayDataset(self.features, self.labels, base, self.device)

    def materialize(self) -> "ArrayDataset":
        """A copy holding only this view's rows (no ``indices``)."""
        if self.indices is None:
            return self
        return ArrayDataset({m: t[self.indices] for m, t in self.features.items()}, self.labels[self.indices],
                            device=self.device)

    def get(self, rows: Tensor | None = None) -> tuple[dict[str, Tensor], Tensor]:
        """Features and labels of ``rows`` (positions within this view; all if None), on
        ``device`` where one is set."""
        if rows is None:
            base = self.indices
        else:
            if rows.device != self.labels.device:  # positions drawn elsewhere (e.g. on the run's device)
                rows = rows.to(self.labels.device)
            base = self.indices[rows] if self.indices is not None else rows
        if base is None:
            feats, labels = dict(self.features), self.labels
        else:
            feats, labels = {m: t[base] for m, t in self.features.items()}, self.labels[base]
        if self.device is not None and labels.device != self.device:
            feats = {m: t.to(self.device, non_blocking=True) for m, t in feats.items()}
            labels = labels.to(self.device, non_blocking=True)
        return feats, labels

    def base_rows(self, part=None) -> np.ndarray:
        """int64 rows of the underlying tensors behind this view's positions ``part`` (every
        position: None), e.g. to index a ``present/<m>`` mask."""
        if part is None:
            return self.indices.cpu().numpy() if self.indices is not None else np.arange(int(self.labels.shape[0]))
        part = np.asarray(part, dtype=np.int64)
        return self.indices[torch.as_tensor(part)].cpu().numpy() if self.indices is not None else part

    def label_array(self) -> np.ndarray:
        y = self.labels if self.indices is None else self.labels[self.indices]
        return y.cpu().numpy()

    def batches(self, batch_size: int, shuffle: bool = True, generator: torch.Generator | None = None,
                drop_last: bool = False) -> Iterator[tuple[dict[str, Tensor], Tensor]]:
        """Mini-batches by index slicing (no DataLoader overhead). The order is drawn on the CPU
        (``generator`` is a CPU generator: the same batches on every device)."""
        n = len(self)
        order = torch.randperm(n, generator=generator, device="cpu") if shuffle else torch.arange(n, device="cpu")
        order = order.to(self.labels.device)
        stop = n - (n % batch_size) if drop_last and n >= batch_size else n
        for s in range(0, stop, batch_size):
            yield self.get(order[s : s + batch_size])

    def to(self, device: torch.device, keep: bool = True, memo: dict | None = None) -> "ArrayDataset":
        """This set for a run on ``device``: ``keep`` moves its tensors there once (views on one
        set of shared tensors share the moved copy through ``memo``, ``id(tensor) -> moved``);
        ``keep=False`` leaves them in host memory and has :meth:`get` move each batch."""
        if not keep:
            return ArrayDataset(self.features, self.labels, self.indices, torch.device(device))
        memo = {} if memo is None else memo

        def move(t: Tensor | None) -> Tensor | None:
            if t is None or t.device == device:
                return t
            if id(t) not in memo:
                memo[id(t)] = (t, t.to(device))  # the source is kept alive so its id stays unique
            return memo[id(t)][1]

        return ArrayDataset({m: move(t) for m, t in self.features.items()}, move(self.labels),
                            move(self.indices))

    def nbytes(self) -> int:
        """Bytes of the tensors this set refers to (shared tensors counted in full)."""
        ts = [*self.features.values(), self.labels] + ([self.indices] if self.indices is not None else [])
        return sum(t.numel() * t.element_size() for t in ts)

    @staticmethod
    def concat(parts: list["ArrayDataset"]) -> "ArrayDataset":
        mats = [p.materialize() for p in parts]
        keys = list(mats[0].features)
        return ArrayDataset({m: torch.cat([p.features[m] for p in mats]) for m in keys},
                            torch.cat([p.labels for p in mats]), device=mats[0].device)


@dataclass
class DatasetMeta:
    """What a model and the engine need to know about a data set."""

    name: str
    num_classes: int
    modalities: dict[str, tuple[int, ...]]  # modality -> per-sample shape, e.g. {"image": (1, 28, 28)}
    class_names: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # free-form: source path, pairing notes, ...


@dataclass
class DatasetBundle:
    """What a loader returns: a train split, a test split and metadata.

    ``client_ids`` (optional, int64 ``[len(train)]``) carries a natural split
    given by the data itself (e.g. one client per speaker, or a manifest's
    client-id column); the ``natural`` partitioner uses it.
    ``public`` is an optional public set known to server and clients.
    """

    train: ArrayDataset
    test: ArrayDataset
    meta: DatasetMeta
    client_ids: Tensor | None = None
    public: ArrayDataset | None = None


@dataclass
class DataSource:
    """A ``[[client_data]]`` data set: some clients' private data comes from it."""

    meta: DatasetMeta
    test: ArrayDataset


@dataclass
class Federation:
    """Clients' private sets, an optional public set, the server's test set."""

    clients: list[ArrayDataset]
    test: ArrayDataset
    meta: DatasetMeta
    public: ArrayDataset | None = None
    # the modalities each client holds (None: every client holds every modality);
    # clients[k] then carries only those modalities (+ their present/<m> masks)
    client_modalities: list[tuple[str, ...]] | None = None
    # which [[client_models]] entry each client builds its model from (None: all use [model])
    client_groups: list[int | None] | None = None
    # clients whose private data comes from a [[client_data]] source: their source index
    # (None: the run's [data]); ``sources[k]`` holds that source's test set and meta
    client_sources: list[int | None] | None = None
    sources: list["DataSource"] = field(default_factory=list)
    # per client of [data] (mmfl.data.corruption.client_report): modalities held, rows, rows lacking
    # each modality, labels dropped / flipped, rows dropped by the missing-row policy (None: not built)
    simulated: list[dict] | None = None

    def group_of(self, cid: int) -> int | None:
        return None if self.client_groups is None else self.client_groups[cid]

    def source_of(self, cid: int) -> int | None:
        return None if self.client_sources is None else self.client_sources[cid]

    def meta_of(self, cid: int) -> DatasetMeta:
        """The metadata of the data set client ``cid`` holds (its own for a [[client_data]] client)."""
        src = self.source_of(cid)
        return self.meta if src is None else self.sources[src].meta

    def test_of(self, cid: int) -> ArrayDataset:
        """Where client ``cid`` evaluates a local model: its data set's test split."""
        src = self.source_of(cid)
        return self.test if src is None else self.sources[src].test

    def modalities_of(self, cid: int) -> tuple[str, ...]:
        if self.client_modalities is None:
            return tuple(self.meta_of(cid).modalities)
        return self.client_modalities[cid]

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def data_sets(self) -> list[ArrayDataset]:
        """Every data set of the federation (clients, test, public, sources' test sets)."""
        return [*self.clients, self.test, *([self.public] if self.public is not None else []),
                *(s.test for s in self.sources)]

    def nbytes(self) -> int:
        """Bytes of the distinct tensors behind all its data sets (shared tensors once)."""
        seen: dict[int, Tensor] = {}
        for d in self.data_sets():
            for t in [*d.features.values(), d.labels, d.indices]:
                if t is not None:
                    seen[id(t)] = t
        return sum(t.numel() * t.element_size() for t in seen.values())

    def to(self, device: torch.device, keep: bool = True) -> "Federation":
        """The federation for a run on ``device`` (:meth:`ArrayDataset.to`; views share moved tensors)."""
        memo: dict = {}
        move = lambda d: d.to(device, keep, memo)  # noqa: E731
        return dataclasses.replace(
            self, clients=[move(c) for c in self.clients], test=move(self.test),
            public=None if self.public is None else move(self.public),
            sources=[dataclasses.replace(s, test=move(s.test)) for s in self.sources])

    def client_sizes(self) -> list[int]:
        return [len(c) for c in self.clients]

    def class_counts(self) -> np.ndarray:
        """``[num_clients, num_classes]`` label counts."""
        k = self.meta.num_classes
        return np.stack([np.bincount(c.label_array(), minlength=k) for c in self.clients]) if self.clients \
            else np.zeros((0, k), dtype=np.int64)
