"""The wireless report's claims as paired tests over seeds (issue 26): every claim table of
``sections.py`` (:func:`claim_table`), and the non-IID-1 claims again before the last round
(:func:`late_section`: the last round follows a burst of A^th-forced uploads)."""

from __future__ import annotations

import numpy as np

from mmfl.bench import load_sibling
from mmfl.bench.render import MIN_SEEDS_FOR_CLAIM
from mmfl.bench.spec_bwireless import claim_head, claim_line, claim_verdict, count_sentence as verdict_count

_r = load_sibling(__file__, "readings")
names_of = _r.names_of


PAIRED_RULE = ("Every claim 'a > b' is a paired test over the seeds both cells have (same seed: same partition, "
               "modality assignment, initialisation, cohorts and test subsets): Δ = the mean per-seed difference "
               "a − b, its 95% percentile-bootstrap CI (10,000 resamples of the seeds) and the two-sided paired "
               "t-test p (`scipy.stats.ttest_rel`, via `mmfl.sweep.paired_verdict`). It *holds* when the CI lies above "
               "0 and p < 0.05, is **reversed** when the CI lies below 0 and p < 0.05, and is *unresolved* "
               f"otherwise; with fewer than {MIN_SEEDS_FOR_CLAIM} paired seeds nothing is claimed.")


def _by_seed(v) -> dict:
    """A cell's values by seed (``v.seeds``; values without seeds by position)."""
    return dict(zip(getattr(v, "seeds", range(len(v))), v))


def paired_claim(a, b, scale: float) -> dict:
    """The paired test of a − b matched by seed, with ``word`` (:func:`mmfl.bench.spec_bwireless.claim_verdict`)."""
    return claim_verdict(_by_seed(a), _by_seed(b), scale)


def claim_table(claims, unit: str = "points") -> tuple[list[str], list[str]]:
    """Claims ``(text, a, b, scale, digits)`` meaning a > b, each a paired test over seeds
    (:func:`paired_claim`), as a markdown table ending with an empty line, and their words."""
    rows = [(text, v, digits) for text, a, b, scale, digits in claims if a and b
            and (v := paired_claim(a, b, scale))["n"] >= 2]
    lines = claim_head(unit) + [claim_line(text, v, digits) for text, v, digits in rows]
    return (lines + [""] if rows else []), [v["word"] for _, v, _ in rows]


def _at_round(b, name: str, rnd: int) -> float | None:
    """The personalized accuracy of run ``name`` at round ``rnd`` (``personal/accuracy`` for the
    methods the engine scores, the run's own ``accuracy`` for the others); None if not evaluated."""
    for r in b.results.rows(name) or []:
        if r.get("round") == rnd:
            v = r.get("personal/accuracy", r.get("accuracy"))
            return float(v) if v is not None and np.isfinite(v) else None
    return None


def late_section(s, raw) -> list[str]:
    """Headline robustness: the final round's reading carries the luck of the last round's
    schedule (docs/algorithms/pfedwireless.md, "A final-round collapse, traced"), so the
    non-IID-1 claims of Tables I-II again on round 15 and on the mean of rounds 15 and 20
    (the evaluated rounds: eval_every = 5; local training is scored once, at the end)."""
    LABEL = s["label"]
    out = []
    for setting in s["settings"]:
        names = {m: names_of(setting, m, "niid1", s) for m in s["methods"]}
        rounds = s["rounds"][setting]
        early = rounds - 5
        if not names.get("pfedwireless"):
            continue

        def cell(m, how):
            v = _r.SeedVals()
            v.seeds = []
            for n in names[m]:
                a, z = _at_round(raw, n, early), _at_round(raw, n, rounds)
                x = a if how == "early" else (None if a is None or z is None else (a + z) / 2)
                if x is not None:
                    v.append(x)
                    v.seeds.append(_r._seed_of(n))
            return v

        evals = sorted({r["round"] for n in names["pfedwireless"] for r in (raw.results.rows(n) or [])
                        if "accuracy" in r})
        out += [f"{setting}, non-IID-1: accuracy (%) at every evaluated round, mean over seeds; the last row: the "
                "proposed method's uploads forced by A^th in that round (Alg. 1 line 8; A_k starts at 0 for every "
                "device, so the devices not picked in the first rounds reach A^th together).", "",
                "| method | " + " | ".join(f"round {x}" for x in evals) + " |", "|---|" + "---|" * len(evals)]
        for m in s["methods"]:
            cells = [[v for n in names[m] if (v := _at_round(raw, n, x)) is not None] for x in evals]
            out.append(f"| {LABEL[m]} | " + " | ".join(f"{100 * np.mean(c):.1f}" if c else "—" for c in cells) + " |")
        forced = [[float(r.get("uploads_forced", 0)) for n in names["pfedwireless"] for r in (raw.results.rows(n) or [])
                   if r.get("round") == x] for x in evals]
        out += ["| Proposed: forced uploads in the round | " + " | ".join(f"{np.mean(c):.1f}" if c else "—" for c in forced)
                + " |", ""]
        claims = []
        for how, what in (("early", f"round {early}"), ("mean", f"mean of rounds {early} and {rounds}")):
            pw = cell("pfedwireless", how)
            for m in s["methods"]:
                if m != "pfedwireless":
                    claims.append((f"{setting}, {what}: Proposed > {LABEL[m]}", pw, cell(m, how), 100.0, 1))
        lines, _ = claim_table(claims, "points")
        out += lines
    return out
