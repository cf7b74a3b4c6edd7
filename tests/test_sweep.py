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


def test_a_run_that_failed_before_writing_anything_is_run_again(tmp_path):
    """run_one's own failed.txt (a run that failed before its folder held a run) does not make
    the folder look like a user's folder that --overwrite must refuse."""
    from mmfl.sweep import run_one

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "failed.txt").write_text("RuntimeError: earlier\n")
    raw = {"data": {"name": "digits"}, "partition": {"name": "dirichlet", "num_clients": 3},
           "model": {"name": "mlp", "hidden": [8]}, "rounds": 1, "threads": 1, "train": {"local_epochs": 1}}
    name, _, err = run_one("r", raw, str(tmp_path))
    assert err is None and (tmp_path / "r" / "summary.json").is_file()
    assert not (tmp_path / "r" / "failed.txt").exists()
