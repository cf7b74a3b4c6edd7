"""Wireless personalized-FMML benchmark tables (grid: grid.toml): Tables I-V, Fig. 3, the eta^
check, communication, diagnostics, the paper's orderings, findings. Rows iterate over the
grid's methods; the claims and the paper's numbers are the paper's named choices. This file is
the spec (the post-run hooks and ``report`` assembling the sections); the readings are in
``readings.py``, the tables in ``sections.py``, Fig. 3 in ``fig3.py``, the prose in ``header.py``.

Every method's accuracy is the engine's personalized evaluation: the personalized methods
declare it, the others (mfedavg, mfedprox, local) run with ``personal_eval = true`` (grid.toml)
and report it under ``personal/`` in their metrics rows (``readings._final`` reads it from there).
Post-run (``post``): Xi of every kept round of the Fig. 3 runs (``xi_history.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mmfl.bench import load_sibling, problem_lines, reading_lines, regenerate_line, run_status, runs_line
from mmfl.sweep import machine

HERE = Path(__file__).resolve().parent
R = load_sibling(__file__, "readings")
S = load_sibling(__file__, "sections")
F = load_sibling(__file__, "fig3")
H = load_sibling(__file__, "header")
context, _final = R.context, R._final


# ----------------------------------------------------------------------------- post-run


def _needs(raw: dict) -> list[str]:
    """The files a finished run of this config must have besides summary.json."""
    return ["xi_history.json"] if raw.get("keep_checkpoints", 1) > 1 else []


def done(d: Path, raw: dict) -> bool:
    return (d / "summary.json").exists() and all((d / f).exists() for f in _needs(raw))


def post(raw: dict, cfg, d: Path, exp=None) -> None:
    """The files a run's reading needs beyond its own (:func:`_needs`), from its checkpoints."""
    need = _needs(raw)
    if "xi_history.json" in need and not (d / "xi_history.json").exists():
        hist = F.xi_history(cfg, d)
        if len(hist["rounds"]) < cfg.run.rounds:
            raise RuntimeError(f"{d.name}: only {len(hist['rounds'])} of {cfg.run.rounds} checkpoints kept")
        (d / "xi_history.json").write_text(json.dumps(hist))
        ckpts = sorted((d / "checkpoints").glob("round_?????"))
        for p in ckpts[:-1]:  # the last one stays (LATEST points to it)
            shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------- the report


def report(b) -> list[str]:
    s, raw = context(b), b
    quick = b.params.get("quick", False)
    png = (b.raw if quick else b.grid.report.parent) / f"{b.grid.report.stem}_fig3.png"  # wireless_fig3.png
    st = run_status(b, lambda n: _final(raw, n), done)
    last = b.last_invocation()
    cmd = b.params["command"]
    out = [
        "# Wireless personalized FMML benchmark (paper 004: Tables I-V, Fig. 3)"
        + (" — QUICK smoke run, not results" if quick else ""), "",
        regenerate_line(b, cmd), "",
        "## Scale", "",
        *H.scale_lines(s),
        "- Partitions: non-IID-1 `k_classes` k = 3; non-IID-2 / 3 `dominant_class` fraction 0.5 / 0.3 "
        "(docs/algorithms/fedamp.md lists how they differ from the paper's wording).",
        "- K^ (the paper's Tables I-II use K^ = K/3): the proposed method's uploaders per parameter group, "
        "with every device training every round; FedAvg's, FedProx's, FedFomo's and FedAMP's devices per round "
        "(the same cohorts for the same seed); local training: every device every round.",
        f"- Seeds {s['seeds']} (run seed: model init, partition, modality assignment, cohorts, the `[system]` "
        "placement and fading, the personalized test subsets; the data sets' own splits are fixed); "
        "mean ± std (population, ddof 0) over seeds.",
        f"- Machine: {machine()}.",
        runs_line(len(st["finished"]), st["planned"], st["run_s"], last),
        "",
    ]
    if len(s["seeds"]) < 5:  # the project's rule: orderings from 5 paired seeds (sections.PAIRED_RULE)
        out += [f"**{len(s['seeds'])} seeds: the claim tables below make no claim.** The comparisons at 5 seeds with "
                "paired tests are in `benchmarks/results/wireless-paired.md` "
                "(`nice -n 10 .venv/bin/mmfl bench benchmarks/wireless/grid-paired.toml`).", ""]
    out += problem_lines(st["failed"], st["nonfinite"], cmd)
    out += ["## Evaluation: personalized, the same for every method", "", *H.eval_section(s)]
    summary = []
    if "t12" in s["groups"]:
        lines, summ = S.t12_section(s, raw)
        summary += summ
        out += ["## Tables I and II: accuracy", "", *lines]
    for title, fn in (("## Table III: ratio vs linear scheduling", S.t3_section),
                      ("## Table IV: K^", S.t4_section),
                      ("## Table V: simulated training time", S.t5_section)):
        lines, summ = fn(s, raw)
        if lines:
            summary += summ
            out += [title, "", *lines]
    lines, summ = F.fig3_section(s, raw, png)
    if lines:
        summary += summ
        out += ["## Fig. 3: the aggregation coefficients of one device", "", *lines]
    lines, summ = S.eta_section(s, raw)
    if lines:
        summary += summ
        out += ["## eta^: how far the coefficients move", "", *lines]
    if "t12" in s["groups"] and "niid1" in s["parts"]:
        late = S.late_section(s, raw)
        if late:
            out += ["## Non-IID-1 before the last round", "",
                    "The final round's accuracy depends on which devices the last round's schedule aggregated "
                    "(docs/algorithms/pfedwireless.md, \"A final-round collapse, traced\"). The Tables I-II "
                    "non-IID-1 claims again, on the evaluation 5 rounds earlier and on the mean of the two "
                    "(local training is scored at the end only).", "", *late]
        out += ["## Communication and time", "", *S.comm_section(s, raw)]
    if "t12" in s["groups"]:
        out += ["## Diagnostics of the personalized methods", "", *S.diag_section(s, raw)]
    out += ["## Does the paper's ordering hold?", "",
            S.PAIRED_RULE, "", *summary, ""]
    out += ["## Findings (generated from the numbers above)", "", *H.findings(s, raw), ""]
    out += [] if quick else reading_lines(HERE / "analysis.md")
    return out + [""]
