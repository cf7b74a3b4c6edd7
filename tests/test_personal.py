"""Personalized evaluation (mmfl.core.personal): each device's test subset follows its own
label distribution, is seeded per device, shrinks rather than distorts when a class has too
few test rows, and evaluate_personalized scores each device's model on its subset with only
the modalities it holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mmfl.data.base import ArrayDataset, DatasetMeta, Federation
from mmfl.core.personal import (class_targets, device_test_indices, evaluate_personalized,
                                  personal_test_indices)

TEST = np.repeat(np.arange(10), 40)  # 10 classes x 40 rows


def test_class_targets_sum_and_largest_remainder():
    t = class_targets(np.array([0.5, 0.25, 0.25]), 7)  # 3.5, 1.75, 1.75 -> 3 1 1 + 2 by remainder
    assert t.sum() == 7 and t.tolist() == [3, 2, 2]
    assert class_targets(np.array([1 / 3] * 3), 10).tolist() == [4, 3, 3]  # ties: lower class first


def test_distributions_follow_the_devices_training_labels():
    uneven = np.repeat(np.arange(10), [36, 34, 31, 29, 30, 30, 30, 30, 23, 27])
    ys = [np.array([3] * 30 + [1] * 20 + [7] * 10),  # 60 rows -> 60 test rows, 30/20/10
          np.random.default_rng(0).permutation(uneven),  # 300 rows -> 300 test rows (every class fits)
          np.array([2] * 10)]  # 10 rows -> max(50, 10) = 50, but class 2 has 40 test rows -> 40
    idx = device_test_indices(TEST, ys, 10, seed=1)
    assert np.bincount(TEST[idx[0]], minlength=10).tolist() == [0, 20, 0, 30, 0, 0, 0, 10, 0, 0]
    assert len(idx[1]) == 300
    p_train = np.bincount(ys[1], minlength=10) / 300
    p_test = np.bincount(TEST[idx[1]], minlength=10) / 300
    assert np.abs(p_train - p_test).max() <= 1 / 300 + 1e-12  # rounding only
    assert np.bincount(TEST[idx[2]], minlength=10).tolist() == [0, 0, 40, 0, 0, 0, 0, 0, 0, 0]
    for i in idx:  # without replacement, valid positions
        assert len(np.unique(i)) == len(i) and i.min() >= 0 and i.max() < len(TEST)


def test_default_size_and_explicit_size():
    ys = [np.arange(10).repeat(2), np.arange(10).repeat(12)]  # 20 rows -> 50; 120 rows -> 120
    assert [len(i) for i in device_test_indices(TEST, ys, 10, 0)] == [50, 120]
    assert [len(i) for i in device_test_indices(TEST, ys, 10, 0, size=30)] == [30, 30]
    assert [len(i) for i in device_test_indices(TEST, ys, 10, 0, size=10_000)] == [400, 400]  # <= len(test)


def test_deterministic_and_seeded_per_device():
    ys = [np.array([0, 1, 1, 2] * 20), np.array([5, 6] * 30)]
    a = device_test_indices(TEST, ys, 10, seed=3)
    b = device_test_indices(TEST, ys, 10, seed=3)
    c = device_test_indices(TEST, ys, 10, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # a device's rows depend on (seed, its id, its labels) only, not on the other devices
    other = device_test_indices(TEST, [np.array([9] * 5), ys[1]], 10, seed=3)
    assert np.array_equal(other[1], a[1])


def test_too_few_rows_shrink_the_set_and_keep_the_proportions():
    test = np.array([0] * 10 + [1] * 100)  # class 0 has only 10 test rows
    idx = device_test_indices(test, [np.array([0] * 50 + [1] * 50)], 2, seed=0)[0]
    # want 100 rows at 50/50, but class 0 fits only 10 -> 20 rows at 50/50
    assert np.bincount(test[idx], minlength=2).tolist() == [10, 10]


def test_classes_without_test_rows_are_dropped_and_devices_may_overlap():
    test = np.array([0] * 30 + [1] * 30)  # class 2 has no test row
    ys = [np.array([0] * 40 + [2] * 60), np.array([2] * 10), np.array([], dtype=np.int64), np.array([0] * 60)]
    idx = device_test_indices(test, ys, 3, seed=0)
    assert np.bincount(test[idx[0]], minlength=3).tolist() == [30, 0, 0]  # renormalized over class 0, capped
    assert len(idx[1]) == 0  # only a class the test set lacks: empty
    assert np.bincount(test[idx[2]], minlength=3).tolist() == [25, 25, 0]  # no training rows: uniform
    # the subsets are drawn independently from one shared set: devices 0 and 3 share rows
    assert len(np.intersect1d(idx[0], idx[3])) > 0


# ----------------------------------------------------------------------------- evaluate_personalized


class ConstantModel(nn.Module):
    """Predicts ``cls`` for every row; checks which modalities it is given."""

    def __init__(self, cls: int, expect: set[str], num_classes: int = 4):
        super().__init__()
        self.cls, self.expect, self.k = cls, expect, num_classes
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, inputs):
        assert set(inputs) == self.expect, (set(inputs), self.expect)
        b = next(iter(inputs.values())).shape[0]
        logits = torch.full((b, self.k), -5.0)
        logits[:, self.cls] = 5.0
        return {"logits": logits + self.bias}


def _federation():
    y_test = torch.arange(4).repeat_interleave(50)  # 4 classes x 50 rows
    test = ArrayDataset({"a": torch.randn(200, 2), "b": torch.randn(200, 3),
                         "present/b": torch.ones(200, dtype=torch.bool)}, y_test)

    def client(labels, mods):
        y = torch.tensor(labels)
        feats = {m: torch.zeros(len(labels), 2 if m == "a" else 3) for m in mods}
        return ArrayDataset(feats, y)

    meta = DatasetMeta("t", 4, {"a": (2,), "b": (3,)})
    fed = Federation(clients=[client([3] * 60, ["a"]), client([1] * 30 + [2] * 30, ["a", "b"]),
                              client([0] * 20, ["b"])],
                     test=test, meta=meta, client_modalities=[("a",), ("a", "b"), ("b",)])
    return fed


def test_evaluate_personalized_on_a_constructed_case():
    fed = _federation()
    models = [ConstantModel(3, {"a"}), ConstantModel(1, {"a", "b", "present/b"}), ConstantModel(1, {"b", "present/b"})]
    calls = []

    def model_of(cid):
        calls.append(cid)
        return models[cid]

    out = evaluate_personalized(model_of, fed, fed.test, seed=0, num_classes=4)
    # device 0: all class 3, predicts 3 -> 1.0; device 1: half 1 / half 2, predicts 1 -> 0.5 (UAR 0.5);
    # device 2: all class 0, predicts 1 -> 0.0
    assert out["client_accuracy"] == pytest.approx([1.0, 0.5, 0.0])
    assert out["accuracy"] == pytest.approx(0.5)
    assert out["accuracy_std"] == pytest.approx(np.std([1.0, 0.5, 0.0]))
    assert out["uar"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert np.isfinite(out["test_loss"])
    assert calls == [0, 1, 2]
    assert out["personal_test_rows"] == pytest.approx((50 + 60 + 50) / 3)  # device 0: 60 wanted, class 3 has 50


def test_indices_are_cached_on_the_federation():
    fed = _federation()
    a = personal_test_indices(fed, fed.test, seed=5, num_classes=4)
    assert personal_test_indices(fed, fed.test, seed=5, num_classes=4) is a
    assert personal_test_indices(fed, fed.test, seed=6, num_classes=4) is not a


def test_device_with_empty_subset_is_left_out_of_the_means():
    fed = _federation()
    fed.clients[2] = ArrayDataset({"b": torch.zeros(5, 3)}, torch.full((5,), 7))  # a class the test set lacks
    models = [ConstantModel(3, {"a"}), ConstantModel(1, {"a", "b", "present/b"}), None]
    out = evaluate_personalized(lambda c: models[c], fed, fed.test, seed=0, num_classes=8)
    assert out["client_accuracy"] == [pytest.approx(1.0), pytest.approx(0.5), None]
    assert out["accuracy"] == pytest.approx(0.75)
