"""The wireless benchmark's claims are paired tests over seeds (issue 26): a claim's two cells
are matched by seed, not by position, and nothing is claimed from fewer than 5 seeds."""

from pathlib import Path

from mmfl.bench import load_sibling

SPEC = Path(__file__).resolve().parent.parent / "benchmarks" / "wireless" / "tables.py"


def _cell(values, seeds):
    R = load_sibling(SPEC, "readings")
    v = R.SeedVals(values)
    v.seeds = list(seeds)
    return v


def test_claims_pair_by_seed():
    S = load_sibling(SPEC, "sections")
    a = _cell([0.50, 0.61, 0.72, 0.83, 0.94], [0, 1, 2, 3, 4])
    b = _cell([0.92, 0.81, 0.70, 0.59, 0.48], [4, 3, 2, 1, 0])  # b is a − 0.02 per seed, listed backwards
    v = S.paired_claim(a, b, 100.0)
    assert v["n"] == 5 and abs(v["delta"] - 2.0) < 1e-9 and v["word"] == "holds"
    lines, words = S.claim_table([("a > b", a, b, 100.0, 1)])
    assert words == ["holds"] and "| 5 | holds |" in lines[2]
    # matched by position the same numbers would be a swing of ±44 points: unresolved
    w = S.paired_claim(list(a), list(b), 100.0)
    assert w["word"] == "unresolved"


def test_no_claim_under_five_seeds():
    S = load_sibling(SPEC, "sections")
    a = _cell([0.60, 0.70, 0.80], [0, 1, 2])
    b = _cell([0.50, 0.61, 0.69, 0.40], [0, 1, 2, 3])  # seed 3 has no partner
    v = S.paired_claim(a, b, 100.0)
    assert v["n"] == 3 and v["word"] == "not claimed (3 seeds)"
    assert "not claimed" in S.verdict_count([v["word"], "holds"], "test")
