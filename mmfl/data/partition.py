"""Partitioners: split the train labels into per-client index arrays.

Every partitioner is registered into :data:`mmfl.data.PARTITIONERS` with a
typed params dataclass and has the factory signature::

    factory(labels: np.ndarray, params, rng: np.random.Generator,
            client_ids: np.ndarray | None = None) -> list[np.ndarray]

It returns one sorted int64 index array (positions into ``labels``) per
client. No sample is given to two clients; every sample is given to exactly
one client except where an entry says otherwise (``k_classes`` when some class
is held by nobody, ``dominant_class`` which drops the ``N % num_clients``
remainder). All randomness comes from ``rng``, so a fixed seed gives the same
split. Impossible settings raise :class:`~mmfl.errors.ConfigError` naming the
field, e.g. ``partition.beta: must be > 0, got -1``.

Classes are the distinct values of ``labels`` (``np.unique``), so labels need
not be ``0..K-1`` and absent classes are simply not there.

Registered names: ``iid``, ``dirichlet``, ``k_classes``, ``dominant_class``,
``quantity_skew``, ``natural``. Reporting helpers (``partition_counts``,
``partition_summary``, ``plot_partition``, ``skew``) live in
:mod:`mmfl.data.partition_report` and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmfl.data import PARTITIONERS
from mmfl.data.partition_report import partition_counts, partition_summary, plot_partition, skew
from mmfl.errors import ConfigError

__all__ = [
    "IIDParams", "DirichletParams", "KClassesParams", "DominantClassParams", "QuantitySkewParams",
    "NaturalParams", "partition_counts", "partition_summary", "plot_partition", "skew",
]


def _bad(name: str, must: str, value) -> ConfigError:
    return ConfigError(f"partition.{name}: must be {must}, got {value!r}")


# ----------------------------------------------------------------------------- params


@dataclass
class _ClientsParams:
    num_clients: int = field(default=10, metadata={"help": "number of clients (>= 1)"})

    def __post_init__(self):
        if self.num_clients < 1:
            raise _bad("num_clients", ">= 1", self.num_clients)


@dataclass
class IIDParams(_ClientsParams):
    pass


@dataclass
class DirichletParams(_ClientsParams):
    beta: float = field(default=0.5, metadata={"help": "Dirichlet concentration (> 0); smaller = more label skew"})
    min_size: int = field(default=10, metadata={"help": "resample until every client holds >= this many samples"})
    max_tries: int = field(default=1000, metadata={"help": "resampling attempts before giving up (>= 1)"})

    def __post_init__(self):
        super().__post_init__()
        if not self.beta > 0:
            raise _bad("beta", "> 0", self.beta)
        if self.min_size < 0:
            raise _bad("min_size", ">= 0", self.min_size)
        if self.max_tries < 1:
            raise _bad("max_tries", ">= 1", self.max_tries)


@dataclass
class KClassesParams(_ClientsParams):
    k: int = field(default=2, metadata={"help": "distinct classes per client (1..number of classes)"})

    def __post_init__(self):
        super().__post_init__()
        if self.k < 1:
            raise _bad("k", ">= 1", self.k)


@dataclass
class DominantClassParams(_ClientsParams):
    fraction: float = field(default=0.5, metadata={
        "help": "share of each client's data from its dominant class, in (0, 1] (0.5 = non-IID-2, 0.3 = non-IID-3)"})

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.fraction <= 1:
            raise _bad("fraction", "in (0, 1]", self.fraction)


@dataclass
class QuantitySkewParams(_ClientsParams):
    beta: float = field(default=0.5, metadata={"help": "Dirichlet concentration of client sizes (> 0); smaller = more skew"})
    min_size: int = field(default=10, metadata={"help": "resample until every client holds >= this many samples"})
    max_tries: int = field(default=1000, metadata={"help": "resampling attempts before giving up (>= 1)"})

    def __post_init__(self):
        super().__post_init__()
        if not self.beta > 0:
            raise _bad("beta", "> 0", self.beta)
        if self.min_size < 0:
            raise _bad("min_size", ">= 0", self.min_size)
        if self.max_tries < 1:
            raise _bad("max_tries", ">= 1", self.max_tries)


@dataclass
class NaturalParams:
    num_clients: int = field(default=0, metadata={
        "help": "0 = one client per distinct client id in the data; otherwise must equal that number"})

    def __post_init__(self):
        if self.num_clients < 0:
            raise _bad("num_clients", ">= 0 (0 = use the data's own split)", self.num_clients)


# ----------------------------------------------------------------------------- helpers


def _labels(labels, num_clients: int) -> np.ndarray:
    y = np.asarray(labels).reshape(-1)
    if num_clients > y.shape[0]:
        raise ConfigError(f"partition.num_clients: must be <= the number of samples ({y.shape[0]}), got {num_clients}")
    return y


def _finish(parts) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_indices(y: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    classes = np.unique(y)
    return classes, [np.flatnonzero(y == c) for c in classes]


# ----------------------------------------------------------------------------- partitioners


@PARTITIONERS.register("iid", IIDParams, help="random equal split (client sizes differ by at most 1)")
def iid(labels, params: IIDParams, rng: np.random.Generator, client_ids=None) -> list[np.ndarray]:
    y = _labels(labels, params.num_clients)
    return _finish(np.array_split(rng.permutation(y.shape[0]), params.num_clients))


@PARTITIONERS.register("dirichlet", DirichletParams,
                       help="label skew: each class split over clients by Dir(beta) (MOON / NIID-Bench)")
def dirichlet(labels, params: DirichletParams, rng: np.random.Generator, client_ids=None) -> list[np.ndarray]:
    """Per class k: p ~ Dir(beta), shares of clients already holding >= N/num_clients
    zeroed, renormalised, idx_k split at cumsum(p)*|idx_k|; the whole draw is
    repeated until every client holds >= min_size samples (as in MOON's code)."""
    n_cl = params.num_clients
    y = _labels(labels, n_cl)
    n = y.shape[0]
    if params.min_size * n_cl > n:
        raise ConfigError(f"partition.min_size: must be <= samples / num_clients ({n} / {n_cl}), "
                          f"got {params.min_size}")
    _, per_class = _class_indices(y)
    for _ in range(params.max_tries):
        batches: list[list[np.ndarray]] = [[] for _ in range(n_cl)]
        sizes = np.zeros(n_cl, dtype=np.int64)
        for idx_k in per_class:
            idx_k = idx_k.copy()
            rng.shuffle(idx_k)
            p = rng.dirichlet(np.full(n_cl, params.beta))
            p = p * (sizes < n / n_cl)
            total = p.sum()
            # Cannot be 0 in exact arithmetic (while samples remain some client is below N/n), but
            # Dir with tiny beta may underflow to exact zeros; fall back to the open clients evenly.
            p = p / total if total > 0 else (sizes < n / n_cl) / max(1, int((sizes < n / n_cl).sum()))
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for j, part in enumerate(np.split(idx_k, cuts)):
                batches[j].append(part)
                sizes[j] += len(part)
        if sizes.min() >= params.min_size:
            return _finish(np.concatenate(b) if b else np.zeros(0, np.int64) for b in batches)
    raise ConfigError(f"partition.min_size: could not give every client >= {params.min_size} samples in "
                      f"{params.max_tries} attempts (beta={params.beta}, {n_cl} clients, {n} samples); "
                      f"lower min_size or num_clients, or raise beta")


@PARTITIONERS.register("k_classes", KClassesParams,
                       help="each client holds k distinct classes (NIID-Bench '#label k')")
def k_classes(labels, params: KClassesParams, rng: np.random.Generator, client_ids=None) -> list[np.ndarray]:
    """Client i gets class i % K first (NIID-Bench), then classes no client holds
    yet (so every class is held whenever num_clients * k >= K), then random
    distinct classes. Each class's samples are split equally (sizes differ by
    at most 1) among its holders. If num_clients * k < K, the classes nobody
    holds are left out: their samples belong to no client."""
    n_cl, k = params.num_clients, params.k
    y = _labels(labels, n_cl)
    classes, per_class = _class_indices(y)
    n_k = len(classes)
    if k > n_k:
        raise ConfigError(f"partition.k: must be <= the number of classes ({n_k}), got {k}")
    held = [[i % n_k] for i in range(n_cl)]
    uncovered = [c for c in range(n_k) if c >= n_cl]
    uncovered = list(rng.permutation(uncovered)) if uncovered else []
    for i in range(n_cl):
        while len(held[i]) < k:
            if uncovered:
                held[i].append(int(uncovered.pop()))
            else:
                free = np.setdiff1d(np.arange(n_k), held[i])
                held[i].append(int(rng.choice(free)))
    parts: list[list[np.ndarray]] = [[] for _ in range(n_cl)]
    for c in range(n_k):
        holders = [i for i in range(n_cl) if c in held[i]]
        if not holders:
            continue
        idx = rng.permutation(per_class[c])
        for i, chunk in zip(holders, np.array_split(idx, len(holders))):
            parts[i].append(chunk)
    return _finish(np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts)


@PARTITIONERS.register("dominant_class", DominantClassParams,
                       help="each client: one dominant class with share `fraction`, rest random from other classes")
def dominant_class(labels, params: DominantClassParams, rng: np.random.Generator,
                   client_ids=None) -> list[np.ndarray]:
    """The wireless paper's non-IID-2 (fraction 0.5) and non-IID-3 (fraction 0.3).

    Every client gets ``size = N // num_clients`` samples; client i's dominant
    class is class ``i % K`` (round-robin) and ``round(fraction * size)`` of its
    samples come from it; the rest are drawn at random (multivariate
    hypergeometric over the remaining per-class pools) from the other classes.
    Samples are never reused: dominant shares are reserved first; if a
    dominant class runs out, the client gets what is left of it and the
    shortfall is drawn with the rest. When filling client i, any class whose
    remaining samples the later clients could not absorb is drawn first, so
    the last clients are not left with only their own class. If the other
    classes do run out (only when the dominant shares exhaust the data) a
    client is topped up from its own class. The ``N % num_clients`` leftover
    samples (and any other unused ones) belong to no client.
    """
    n_cl = params.num_clients
    y = _labels(labels, n_cl)
    n = y.shape[0]
    _, per_class = _class_indices(y)
    n_k = len(per_class)
    size = n // n_cl
    n_dom = min(size, int(round(params.fraction * size)))
    dom = np.arange(n_cl) % n_k
    pools = [rng.permutation(idx) for idx in per_class]  # shuffled; taken from the front
    ptr = np.zeros(n_k, dtype=np.int64)
    sizes = np.array([len(p) for p in pools], dtype=np.int64)

    def take(c: int, m: int) -> np.ndarray:
        out = pools[c][ptr[c]: ptr[c] + m]
        ptr[c] += len(out)
        return out

    parts = [take(int(dom[i]), n_dom) for i in range(n_cl)]
    need = np.array([size - len(p) for p in parts], dtype=np.int64)
    fut_total = int(need.sum())
    fut_dom = np.bincount(dom, weights=need, minlength=n_k).astype(np.int64)
    for i in range(n_cl):
        d = int(dom[i])
        fut_total -= need[i]
        fut_dom[d] -= need[i]
        if need[i] <= 0:
            continue
        supply = sizes - ptr
        # what later clients (those not dominated by c) can still absorb of class c
        must = np.maximum(0, supply - (fut_total - fut_dom))
        must[d] = 0
        if must.sum() > need[i]:
            must = rng.multivariate_hypergeometric(must, int(need[i]))
        rest = int(need[i] - must.sum())
        avail = supply - must
        avail[d] = 0
        extra = rng.multivariate_hypergeometric(avail, rest) if avail.sum() >= rest else avail
        counts = must + extra
        short = int(need[i] - counts.sum())
        if short > 0:  # other classes exhausted: top up from the own class
            counts[d] += min(short, int(supply[d]))
        chosen = [take(c, int(counts[c])) for c in range(n_k) if counts[c] > 0]
        parts[i] = np.concatenate([parts[i], *chosen])
    return _finish(parts)


@PARTITIONERS.register("quantity_skew", QuantitySkewParams,
                       help="IID labels, client sizes from Dir(beta) (NIID-Bench iid-diff-quantity)")
def quantity_skew(labels, params: QuantitySkewParams, rng: np.random.Generator,
                  client_ids=None) -> list[np.ndarray]:
    """Shuffle all samples, draw size shares p ~ Dir(beta), split at cumsum(p)*N;
    redraw p until every client holds >= min_size samples."""
    n_cl = params.num_clients
    y = _labels(labels, n_cl)
    n = y.shape[0]
    if params.min_size * n_cl > n:
        raise ConfigError(f"partition.min_size: must be <= samples / num_clients ({n} / {n_cl}), "
                          f"got {params.min_size}")
    idx = rng.permutation(n)
    for _ in range(params.max_tries):
        p = rng.dirichlet(np.full(n_cl, params.beta))
        cuts = (np.cumsum(p) * n).astype(int)[:-1]
        cuts = np.clip(cuts, 0, n)
        sizes = np.diff(np.concatenate([[0], cuts, [n]]))
        if sizes.min() >= params.min_size:
            return _finish(np.split(idx, cuts))
    raise ConfigError(f"partition.min_size: could not give every client >= {params.min_size} samples in "
                      f"{params.max_tries} attempts (beta={params.beta}, {n_cl} clients, {n} samples); "
                      f"lower min_size or num_clients, or raise beta")


@PARTITIONERS.register("natural", NaturalParams,
                       help="the data's own split: one client per distinct client id (e.g. per speaker)")
def natural(labels, params: NaturalParams, rng: np.random.Generator, client_ids=None) -> list[np.ndarray]:
    """Client j holds the samples whose id is the j-th smallest distinct id.
    ``num_clients`` 0 (default) takes all of them; any other value must equal
    the number of distinct ids. ``rng`` is unused."""
    y = np.asarray(labels).reshape(-1)
    if client_ids is None:
        raise ConfigError("partition: 'natural' needs per-sample client ids from the data set "
                          "(this data set has none); pick another partition")
    ids = np.asarray(client_ids).reshape(-1)
    if ids.shape[0] != y.shape[0]:
        raise ConfigError(f"partition: 'natural' got {ids.shape[0]} client ids for {y.shape[0]} samples")
    uniq, inverse = np.unique(ids, return_inverse=True)
    if params.num_clients and params.num_clients != len(uniq):
        raise ConfigError(f"partition.num_clients: must be 0 or the data's number of clients ({len(uniq)}) "
                          f"for 'natural', got {params.num_clients}")
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(uniq)))[:-1]
    return _finish(np.split(order, bounds))
