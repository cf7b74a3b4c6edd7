"""Properties of the partitioners in mmfl.data.partition and the report helpers."""

from __future__ import annotations

import numpy as np
import pytest

from mmfl.data import PARTITIONERS
from mmfl.data.partition import partition_counts, partition_summary, plot_partition, skew
from mmfl.errors import ConfigError

K, PER = 10, 500
LABELS = np.repeat(np.arange(K), PER)  # 10 classes x 500 samples


def split(name, labels=LABELS, seed=0, client_ids=None, **values):
    entry = PARTITIONERS.get(name)
    params = PARTITIONERS.params(name, values)
    return entry.factory(labels, params, np.random.default_rng(seed), client_ids)


def assert_disjoint(parts, n, exact=True):
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "each index array is sorted and has no repeats"
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "no sample given to two clients"
    assert allidx.min(initial=0) >= 0 and allidx.max(initial=0) < n
    if exact:
        assert len(allidx) == n, "every sample assigned"


def test_registered_names():
    for name in ["iid", "dirichlet", "k_classes", "dominant_class", "quantity_skew", "natural"]:
        assert name in PARTITIONERS
        assert PARTITIONERS.get(name).params is not None


@pytest.mark.parametrize("name,values", [
    ("iid", {}),
    ("iid", {"num_clients": 7}),
    ("dirichlet", {"beta": 0.5}),
    ("dirichlet", {"beta": 0.1, "num_clients": 20}),
    ("k_classes", {"k": 2}),
    ("k_classes", {"k": 3, "num_clients": 4}),  # 4 * 3 >= 10: every class covered
    ("quantity_skew", {"beta": 0.5}),
])
def test_every_sample_assigned_exactly_once(name, values):
    parts = split(name, **values)
    assert len(parts) == values.get("num_clients", 10)
    assert_disjoint(parts, len(LABELS))


def test_natural_every_sample_assigned_exactly_once():
    rng = np.random.default_rng(3)
    ids = rng.choice([5, 11, 42, 7], size=len(LABELS))
    parts = split("natural", client_ids=ids)
    assert len(parts) == 4
    assert_disjoint(parts, len(LABELS))
    for j, cid in enumerate(sorted({5, 11, 42, 7})):  # client j = j-th smallest id
        np.testing.assert_array_equal(parts[j], np.flatnonzero(ids == cid))
    assert len(split("natural", client_ids=ids, num_clients=4)) == 4


def test_natural_requires_client_ids_and_matching_num_clients():
    with pytest.raises(ConfigError, match="natural"):
        split("natural")
    ids = np.arange(len(LABELS)) % 3
    with pytest.raises(ConfigError, match="partition.num_clients"):
        split("natural", client_ids=ids, num_clients=4)


def test_iid_sizes_balanced():
    for n_cl in (3, 7, 10, 33):
        sizes = [len(p) for p in split("iid", num_clients=n_cl)]
        assert max(sizes) - min(sizes) <= 1


def test_dirichlet_min_size_respected():
    for seed in range(3):
        parts = split("dirichlet", seed=seed, beta=0.1, num_clients=20, min_size=50)
        assert min(len(p) for p in parts) >= 50


def test_dirichlet_skew_increases_as_beta_falls():
    def mean_skew(beta):
        return np.mean([skew(partition_counts(LABELS, split("dirichlet", seed=s, beta=beta)))
                        for s in range(4)])

    s01, s05, s5 = mean_skew(0.1), mean_skew(0.5), mean_skew(5.0)
    assert s01 > s05 > s5
    iid_skew = skew(partition_counts(LABELS, split("iid")))
    assert s5 < 0.3 and iid_skew < 0.2


def test_quantity_skew_sizes_vary_labels_iid():
    parts = split("quantity_skew", beta=0.3, min_size=20)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 20 and sizes.max() > 2 * sizes.min()


def test_k_classes_each_client_holds_exactly_k_classes():
    for k in (1, 2, 3, 10):
        for n_cl in (5, 10, 20):
            counts = partition_counts(LABELS, split("k_classes", k=k, num_clients=n_cl, seed=k))
            assert np.all((counts > 0).sum(axis=1) == k)
            if n_cl * k >= K:
                assert np.all(counts.sum(axis=0) == PER), "every class held by someone"


def test_k_classes_uncovered_classes_left_out():
    parts = split("k_classes", k=2, num_clients=3)  # 6 < 10 classes: 4 classes held by nobody
    assert_disjoint(parts, len(LABELS), exact=False)
    counts = partition_counts(LABELS, parts)
    assert (counts.sum(axis=0) > 0).sum() == 6


@pytest.mark.parametrize("fraction", [0.3, 0.5, 1.0])
@pytest.mark.parametrize("num_clients", [5, 10, 20])
def test_dominant_class_share_is_fraction(fraction, num_clients):
    parts = split("dominant_class", fraction=fraction, num_clients=num_clients, seed=1)
    assert_disjoint(parts, len(LABELS), exact=False)
    counts = partition_counts(LABELS, parts)
    size = len(LABELS) // num_clients
    assert np.all(counts.sum(axis=1) == size)
    sharers = -(-num_clients // K)  # clients per dominant class
    for i in range(num_clients):
        d = i % K  # round-robin dominant class
        if round(fraction * size) * sharers <= PER:  # enough samples of the class
            assert counts[i, d] == round(fraction * size)
            assert abs(counts[i, d] / size - fraction) <= 1 / size
        else:  # class exhausted (5 clients x 1000 > 500): gets all of it, rest from others
            assert counts[i, d] == PER // sharers
        assert counts[i].argmax() == d or fraction < 0.5


def test_dominant_class_never_reuses_samples_when_class_runs_out():
    # 20 clients, fraction 1: clients i and i+10 share class i (500 samples): 250 each, exact
    parts = split("dominant_class", fraction=1.0, num_clients=20)
    counts = partition_counts(LABELS, parts)
    assert_disjoint(parts, len(LABELS))
    assert np.all(counts.max(axis=1) == 250)
    # uneven classes: class 0 too small for its dominant share; shortfall taken from others
    y = np.concatenate([np.zeros(20, int), np.repeat(np.arange(1, 5), 200)])
    parts = split("dominant_class", labels=y, fraction=0.5, num_clients=4)
    counts = partition_counts(y, parts)
    assert_disjoint(parts, len(y), exact=False)
    assert counts[0, 0] == 20 and np.all(counts.sum(axis=1) == len(y) // 4)


@pytest.mark.parametrize("name,values", [
    ("iid", {}), ("dirichlet", {"beta": 0.3}), ("k_classes", {"k": 2}),
    ("dominant_class", {"fraction": 0.3}), ("quantity_skew", {}),
])
def test_deterministic_for_fixed_seed(name, values):
    a, b = split(name, seed=7, **values), split(name, seed=7, **values)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = split(name, seed=8, **values)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("name,values,field_name", [
    ("dirichlet", {"beta": 0.0}, "partition.beta"),
    ("dirichlet", {"beta": -1.0}, "partition.beta"),
    ("quantity_skew", {"beta": 0}, "partition.beta"),
    ("iid", {"num_clients": 0}, "partition.num_clients"),
    ("k_classes", {"k": 0}, "partition.k"),
    ("dominant_class", {"fraction": 0.0}, "partition.fraction"),
    ("dominant_class", {"fraction": 1.5}, "partition.fraction"),
    ("dirichlet", {"max_tries": 0}, "partition.max_tries"),
])
def test_invalid_params_raise_config_error(name, values, field_name):
    with pytest.raises(ConfigError, match=field_name):
        PARTITIONERS.params(name, values)


@pytest.mark.parametrize("name", ["iid", "dirichlet", "k_classes", "dominant_class", "quantity_skew"])
def test_more_clients_than_samples_raises(name):
    with pytest.raises(ConfigError, match="partition.num_clients"):
        split(name, labels=np.arange(5) % 2, num_clients=6)


def test_k_larger_than_num_classes_raises():
    with pytest.raises(ConfigError, match="partition.k"):
        split("k_classes", k=K + 1)


def test_unmeetable_min_size_raises():
    with pytest.raises(ConfigError, match="partition.min_size"):
        split("dirichlet", min_size=600)  # 600 * 10 > 5000
    with pytest.raises(ConfigError, match="partition.min_size"):
        split("dirichlet", beta=0.01, num_clients=50, min_size=99, max_tries=3)
    with pytest.raises(ConfigError, match="partition.min_size"):
        split("quantity_skew", beta=0.05, num_clients=50, min_size=99, max_tries=3)


def test_partition_summary_contains_counts():
    counts = np.array([[12, 0, 345], [7, 89, 1]])
    text = partition_summary(counts, ["cat", "dog", "eel"])
    for token in ["cat", "dog", "eel", "12", "345", "89", "357", "97", "total"]:
        assert token in text
    last = text.splitlines()[-1]
    assert "min 97" in last and "max 357" in last and "mean 227.0" in last
    assert "entropy" in last and "share" in last


def test_skew_extremes():
    assert skew(np.eye(4, dtype=int) * 10) == 1.0
    assert skew(np.full((3, 4), 5)) == 0.25


def test_plot_partition_writes_png(tmp_path):
    counts = partition_counts(LABELS, split("dirichlet", beta=0.3))
    out = plot_partition(counts, tmp_path / "sub" / "parts.png")
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
