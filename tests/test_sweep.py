"""The benchmarks' statistics: a paired comparison over seeds (bootstrap CI + paired t-test)."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from mmfl.sweep import paired_verdict


def test_paired_verdict_holds_reverses_or_stays_unresolved():
    a, b = [3.0, 4.0, 5.0, 6.0, 7.0], [1.0, 2.0, 3.0, 4.0, 6.0]
    v = paired_verdict(a, b)
    assert v["delta"] == pytest.approx(1.8) and v["n"] == 5
    assert v["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert 0 < v["lo"] <= 1.8 <= v["hi"] and v["text"].startswith("holds")
    assert paired_verdict(b, a)["text"].startswith("**reversed**")
    # a shift that is consistent across seeds is resolved even when the spread over seeds is large
    assert paired_verdict([10.0, 30.0, 50.0, 70.0, 90.0], [9.0, 29.5, 48.0, 69.0, 88.8])["text"].startswith("holds")
    v = paired_verdict([3.0, 4.0, 5.0, 6.0, 7.0], [3.5, 3.0, 6.0, 5.0, 7.2])  # mixed signs
    assert v["text"].startswith("unresolved") and v["lo"] < 0 < v["hi"]


def test_paired_verdict_needs_pairs():
    with pytest.raises(ValueError, match="pair them"):
        paired_verdict([1.0, 2.0], [1.0])
    v = paired_verdict([1.0], [2.0])
    assert v["text"].startswith("not testable") and math.isnan(v["lo"])
    assert paired_verdict([1.0, 2.0], [1.0, 2.0])["text"].startswith("unresolved")
