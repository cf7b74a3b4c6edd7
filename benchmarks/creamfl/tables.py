"""CreamFL benchmark tables (grid: grid.toml): Table 1 (retrieval, with the reference rows
and the distillation teacher's quality), Table 2 (VQA, from the ``vqa.json`` the group's post
step writes), Table 3 (ablation), Figure 4 (bytes vs R@1_sum), the paper's orderings as paired
tests and the findings read off the numbers. Rows iterate over the grid's methods; the claims
and the reference rows are the paper's / issue 13's named choices."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mmfl.bench import load_sibling, md_table, ms, paired, problem_lines, reading_lines, regenerate_line, runs_line
from mmfl.sweep import machine

H = load_sibling(__file__, "header")  # the settings' scale text
F4 = load_sibling(__file__, "fig4")  # Figure 4's points and plot
R = load_sibling(__file__, "rung")  # the rung toward the paper's regime (issue 26)

KEY = "rsum_authors"  # the paper's R@1_sum: i2t + t2i R@1 on the fifths (its 1K) + on all (its 5K)
TWO = "r1_sum"  # i2t R@1 + t2i R@1 on one gallery (all test pairs): this benchmark's figure before issue 26
RKEYS = ["fold_i2t_r1", "fold_t2i_r1", "i2t_r1", "t2i_r1", KEY, TWO]
SERVER_ALONE, SHARED_ADAM, SHARED_NO_KD = "server_alone", "shared_adam", "shared_no_kd"  # groups.t1.extra
DISTILL_TRAIN = "distill_train"  # groups.t1.extra: BatchNorm in train mode during eq. 7
PAPER_SUM = "paper R@1_sum (MS-COCO: 1K i2t + 1K t2i + 5K i2t + 5K t2i R@1)"
T1_CLAIMS = [  # the paper's Table 1 ordering, as pairwise claims "a > b"
    ("creamfl", "reamfl_iot"), ("creamfl", "reamfl_avg"), ("creamfl", "fedgems"), ("creamfl", "fedet"),
    ("creamfl", "fedmd"), ("reamfl_iot", "fedgems"), ("reamfl_iot", "fedet"), ("reamfl_avg", "fedgems"),
    ("reamfl_avg", "fedet"), ("fedgems", "fedmd"), ("fedet", "fedmd"), ("fedmd", "creamfl_fedavg"),
    ("fedmd", "creamfl_fediot"), ("creamfl", "creamfl_fedavg"), ("creamfl", "creamfl_fediot"),
]
T2_CLAIMS = [("creamfl", "fedgems"), ("creamfl", "reamfl_iot"), ("creamfl", "reamfl_avg"), ("creamfl", "fedet"),
             ("creamfl", "fedmd"), ("creamfl", "creamfl_fediot"), ("creamfl", "creamfl_fedavg"),
             ("fedgems", "fedmd"), ("fedmd", "creamfl_fediot"), ("creamfl_fediot", "creamfl_fedavg")]
T3_CLAIMS = [("creamfl", "gca_inter"), ("creamfl", "gca_intra"), ("gca_inter", "gca"), ("gca_intra", "gca"),
             ("gca", "reamfl_iot"), ("gca", "reamfl_avg"), ("gca", "reamfl_mean"), ("reamfl_iot", "reamfl_mean"),
             ("reamfl_avg", "reamfl_mean")]
CLAIM_HEAD = ["| claim (paper) | mean Δ R@1_sum (paired) | 95% bootstrap CI | paired t-test p | here |",
              "|---|---|---|---|---|"]


def vqa(raw: dict, cfg, run_dir: Path, exp) -> None:
    """Table 2's post step (groups.t2.post): fine-tune a VQA head on the run's final server model
    (frozen encoders, the defaults of ``mmfl vqa``) on the emoji VQA set; writes ``run_dir/vqa.json``."""
    from mmfl.vqa_eval import vqa_of_run

    vqa_of_run(run_dir, emoji=True)


# ----------------------------------------------------------------------------- readings


def _ws(e) -> bool:
    return bool(e.info.get("weight_sharing"))


def _paper(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else str(v or "—")


def _terms(v) -> str:
    """The paper's four R@1 terms: 1K i2t / 1K t2i / 5K i2t / 5K t2i."""
    return " / ".join(f"{x:.2f}" for x in v) if v else "—"


def _pv(a: dict, b: dict) -> dict | None:
    """The paired verdict of a vs b over their common seeds (None with fewer than two)."""
    return paired(a, b) if sum(k in b for k in a) >= 2 else None


def _m(vals: list[float]) -> tuple[float, float, int] | None:
    return (float(np.mean(vals)), float(np.std(vals)), len(vals)) if vals else None


def _fmt(x: tuple[float, float, int] | None) -> str:
    if x is None:
        return "—"
    return f"{x[0]:.1f} ± {x[1]:.1f}" if x[2] > 1 else f"{x[0]:.1f}"


def _count(verdicts: list[dict], table: str) -> str:
    held = sum(v["delta"] > 0 for v in verdicts)
    ok = sum(v["text"].startswith("holds") for v in verdicts)
    rev = sum(v["text"].startswith("**reversed**") for v in verdicts)
    return (f"{held} of {len(verdicts)} pairwise {table} claims hold in the mean; {ok} hold and {rev} are "
            f"reversed by the paired test (95% bootstrap CI of the per-seed difference excludes 0 and paired "
            f"t-test p < 0.05), the rest are unresolved.")


def _claim_rows(pairs, verdicts_out: list) -> list[str]:
    rows = []
    for label, v in pairs:
        if v is None:
            continue
        verdicts_out.append(v)
        rows.append(f"| {label} | {v['delta']:+.1f} | [{v['lo']:+.1f}, {v['hi']:+.1f}] | {v['p']:.3f} "
                    f"| {v['text'].split(' (')[0]} |")
    return rows


# ----------------------------------------------------------------------------- tables


def table1(b) -> list[str]:
    seeds, g = b.grid.groups["t1"].seeds, b.grid.groups["t1"]
    n = len(seeds)
    lines = []
    for st, se in b.grid.settings("t1").items():
        rows = []
        for m, e in g.methods.items():
            if not b.vals("t1", m, st, key=KEY):
                continue  # not run in this regeneration
            cells = [ms(b.vals("t1", m, st, key=k), n) for k in RKEYS]
            cells[4] = f"**{cells[4]}**"
            up, down = (ms(b.vals("t1", m, st, key=k), n, 2) for k in ("_mb_up", "_mb_down"))
            kind = "homogeneous" if _ws(e) else "heterogeneous"
            rows.append([kind, e.label, *cells, up, down, _paper(e.info.get("paper_r1")),
                         _terms(e.info.get("paper_r1_terms"))])
        for x, e in g.extra.items():
            if b.vals("t1", x, st, key=KEY):
                rows.append(["reference", e.label, *[ms(b.vals("t1", x, st, key=k), n) for k in RKEYS],
                             "—", "—", "—", "—"])
        if not rows:
            continue
        lines += [f"### {st}: {se.label}", "",
                  f"Final round, server model, test set; mean ± std over seeds {seeds}. *Fifths*: the mean over "
                  "5 strided folds of the test pairs (fold f = pairs i with i % 5 == f), the analogue of the "
                  "paper's 1K (5 folds of 1,000 of COCO's 5K test images); *all*: one pass over every test pair, "
                  "the analogue of its 5K. **R@1_sum** = the four R@1 terms, as the paper's Table 1 (and the "
                  "authors' code) computes it; the last recall column is the two-term figure on one gallery that "
                  "this report called \"R@1 sum\" before. MB per round = engine payload bytes (10^6) per round, "
                  "mean over rounds, all clients of the round. Methods without finished runs are left out.", "",
                  *md_table(["type", "method", "i2t R@1 (fifths)", "t2i R@1 (fifths)", "i2t R@1 (all)",
                             "t2i R@1 (all)", "**R@1_sum** (four terms)", "R@1 i2t+t2i (one gallery: all)",
                             "MB up / round", "MB down / round", PAPER_SUM,
                             "paper's terms (1K i2t / 1K t2i / 5K i2t / 5K t2i R@1)"], rows)]
        lines += ["", "*Server alone*: `reamfl_mean` with `algorithm.kd_weight=0` (and one client per round "
                  "for one local epoch: with no distillation the clients never reach the server, so its "
                  "trajectory is the same): the server trains on the public pairs exactly as in every "
                  "representation-exchange method (same seeds, same steps) but distills nothing. A method above "
                  "it gains from the clients; one below it is hurt by them. *One Adam for both server phases*: "
                  "`creamfl` with `algorithm.server_optimizer=\"shared\"`, the optimizer of the authors' code. "
                  "*BatchNorm in train mode*: `creamfl` with `algorithm.distill_norm=\"train\"` (the authors' "
                  "code; the default runs eq. 7 with BatchNorm's running statistics, see "
                  "`docs/algorithms/creamfl.md`).", ""]
        lines += teacher_table(b, st)
    return lines


def teacher_table(b, st) -> list[str]:
    """How good eq. 7's teacher is: the R@1 sum on the public set of the aggregated client
    representations vs the server's own, final round (keys logged by every CreamFL-family run)."""
    n = len(b.grid.groups["t1"].seeds)
    rows = []
    for m, e in b.methods("t1").items():
        if _ws(e):
            continue
        tgt, own = b.vals("t1", m, st, key="target_public_r1_sum"), b.vals("t1", m, st, key="server_public_r1_sum")
        finals = [b.results.final(x, TWO) for x in b.names("t1", m, st).values()]
        cos = [np.mean([v for k, v in r.items() if k.startswith("target_cos/")])
               for r in finals if r is not None and any(k.startswith("target_cos/") for k in r)]
        if tgt and own:
            rows.append([e.label, ms(tgt, n), ms(own, n), ms(cos, n, 2)])
    if not rows:
        return []
    return [f"**The distillation's teacher ({st})**: i2t + t2i R@1 on the *public* set (one gallery), final "
            "round, of the "
            "aggregated client representations the server distills toward (eq. 6-7) and of the server's own "
            "representations (before distilling), and their mean cosine; mean ± std over seeds.", "",
            *md_table(["method", "teacher (aggregated clients)", "server's own", "cosine teacher-server"], rows), ""]


def table2(b) -> list[str]:
    """VQA accuracy of each method's final server model (emoji VQA set), and the paper's ordering
    as paired claims."""
    g = b.grid.groups["t2"]
    seeds, st = g.seeds, next(iter(g.settings))
    by = {m: b.by_seed("t2", m, st, key="accuracy", reader="vqa.json") for m in [*g.methods, *g.extra]}
    if not any(by.values()):
        return ["Not run in this regeneration (no finished Table 2 run; the command above runs it).", ""]
    lines = [f"VQA accuracy (%, soft score min(#humans / 3, 1)) of the final server model on the emoji VQA set "
             f"(`mmfl vqa RUN --emoji`, frozen server encoders, a fused-product MLP head fine-tuned on the train "
             f"split's questions; see `docs/vqa.md`: the questions are templated over real emoji images, so the "
             f"numbers are not comparable with VQA v2's); mean ± std over seeds {seeds}.", "",
             *md_table(["method", "VQA accuracy", "paper (Table 2: VQA v2.0 accuracy over its 3,000 most frequent answers, %)"], [
                 *[[e.label, ms(list(by[m].values()), len(seeds)), e.info.get("paper_vqa", "—")]
                   for m, e in g.methods.items() if by[m]],
                 *[[f"reference: {e.label}", ms(list(by[x].values()), len(seeds)), "—"]
                   for x, e in g.extra.items() if by[x]]]),
             "", f"### {st}: Table 2 ordering (the paper: CreamFL > FedGEMS > reamFL+IoT > FedET > "
             "reamFL+Avg > FedMD > FedIoT > FedAvg)", "", CLAIM_HEAD[0].replace("R@1_sum", "VQA accuracy"),
             CLAIM_HEAD[1]]
    label = {m: e.label for m, e in g.methods.items()}
    verdicts: list[dict] = []
    lines += _claim_rows([(f"{label[x]} > {label[y]}", _pv(by[x], by[y])) for x, y in T2_CLAIMS
                          if x in label and y in label], verdicts)
    lines += _claim_rows([(f"{label[m]} > server alone", _pv(by[m], by[SERVER_ALONE])) for m in label], [])
    lines.append("")
    if verdicts:
        lines += [_count(verdicts, "Table 2"), ""]
    return lines


def table3(b) -> list[str]:
    seeds = b.grid.groups["t3"].seeds
    lines = []
    for st in b.grid.settings("t3"):
        rows = []
        for m, e in b.methods("t3").items():
            if not b.vals("t3", m, st, key=KEY):
                continue
            over = dict(e.over.set)
            desc = f"`{over.pop('algorithm.name')}`" + "".join(f" `{k}={str(v).lower()}`" for k, v in over.items())
            rows.append([e.label, desc, ms(b.vals("t3", m, st, key=KEY), len(seeds)),
                         ms(b.vals("t3", m, st, key=TWO), len(seeds)), _paper(e.info.get("paper"))])
        if rows:
            lines += [f"### {st}: R@1_sum (four terms, as Table 1) and i2t + t2i R@1 on one gallery, mean ± std "
                      f"over seeds {seeds}", "",
                      *md_table(["components", "run overrides", "R@1_sum", "R@1 i2t+t2i (one gallery)",
                                 "paper R@1_sum (Table 3, MS-COCO: 1K i2t + 1K t2i + 5K i2t + 5K t2i R@1, as Table 1)"], rows), ""]
    return lines or ["Not run in this regeneration (no finished Table 3 run beyond Table 1's).", ""]


# ----------------------------------------------------------------------------- orderings and findings


def ordering(b) -> tuple[list[str], list[str]]:
    """Pairwise checks of the paper's orderings (paired over seeds); the lines of the tables and a summary."""
    lines, summary = [], []
    methods, t3m = b.methods("t1"), b.methods("t3")
    label = {m: e.label for m, e in methods.items()}
    for st in b.grid.settings("t1"):
        by = {m: b.by_seed("t1", m, st, key=KEY) for m in [*methods, *b.grid.groups["t1"].extra]}
        t1 = {m: list(by[m].values()) for m in methods if by[m]}
        if t1:
            rank = sorted(t1, key=lambda m: -np.mean(t1[m]))
            summary.append(f"- **{st}**, Table 1 ranking by mean R@1_sum: "
                           + " > ".join(f"{label[m]} ({np.mean(t1[m]):.1f})" for m in rank) + ".")
            lines += [f"### {st}: Table 1 ordering (the paper: CreamFL > reamFL+IoT/Avg > FedGEMS/FedET > "
                      "FedMD > FedAvg/FedIoT)", "", *CLAIM_HEAD]
            verdicts: list[dict] = []
            lines += _claim_rows([(f"{label[x]} > {label[y]}", _pv(by[x], by[y]))
                                  for x, y in T1_CLAIMS if x in t1 and y in t1], verdicts)
            lines.append("")
            if verdicts:
                summary.append("  " + _count(verdicts, "Table 1"))
            # every method against the server alone: does client knowledge help the server?
            lines += [f"### {st}: each method against the server alone (does client knowledge help?)", "",
                      "| claim | mean Δ R@1_sum (paired) | 95% bootstrap CI | paired t-test p | here |",
                      "|---|---|---|---|---|"]
            ref_v: list[dict] = []
            lines += _claim_rows([(f"{label[m]} > server alone", _pv(by[m], by[SERVER_ALONE]))
                                  for m in methods if m in t1], ref_v)
            lines += _claim_rows([("CreamFL > CreamFL with one Adam for both phases",
                                   _pv(by["creamfl"], by[SHARED_ADAM]) if "creamfl" in by else None),
                                  ("one Adam: CreamFL > the same with distillation weight 1e-9",
                                   _pv(by[SHARED_ADAM], by[SHARED_NO_KD])),
                                  ("CreamFL (BatchNorm eval in eq. 7) > the same in train mode",
                                   _pv(by["creamfl"], by[DISTILL_TRAIN]) if "creamfl" in by else None)], [])
            lines.append("")
            if ref_v:
                above = sum(v["text"].startswith("holds") for v in ref_v)
                below = sum(v["text"].startswith("**reversed**") for v in ref_v)
                summary.append(f"  Against the server alone: {above} of {len(ref_v)} methods are above it and "
                               f"{below} below it by the paired test, the rest unresolved.")
        by3 = {m: b.by_seed("t3", m, st, key=KEY) for m in t3m}
        t3 = {m: list(v.values()) for m, v in by3.items() if v}
        if t3:
            lines += [f"### {st}: Table 3 ordering (the paper: full > GCA+inter > GCA+intra > GCA > "
                      "IoT > Avg > Mean)", "", *CLAIM_HEAD]
            verdicts = []
            lines += _claim_rows([(f"{t3m[x].label} > {t3m[y].label}", _pv(by3[x], by3[y]))
                                  for x, y in T3_CLAIMS if x in t3 and y in t3], verdicts)
            lines.append("")
            if verdicts:
                rank = sorted(t3, key=lambda k: -np.mean(t3[k]))
                summary.append(f"- **{st}**, Table 3 ranking by mean R@1_sum: "
                               + " > ".join(f"{t3m[k].label} ({np.mean(t3[k]):.1f})" for k in rank) + ".")
                summary.append("  " + _count(verdicts, "Table 3"))
    return lines, summary


def findings(b) -> list[str]:
    """Statements read off the numbers (no interpretation): ranks, gaps, bytes, Fig. 4 trends."""
    out = []
    methods = b.methods("t1")
    for st in b.grid.settings("t1"):
        means = {m: v for m in methods if (v := _m(b.vals("t1", m, st, key=KEY))) is not None}
        if not means:
            continue
        rank = sorted(means, key=lambda m: -means[m][0])
        lab = {m: e.label for m, e in methods.items()}
        lines = [f"**{st}**"]
        if "creamfl" in means:
            lines.append(f"- CreamFL ranks {rank.index('creamfl') + 1} of {len(rank)} in Table 1 "
                         f"(R@1_sum {_fmt(means['creamfl'])}); first: {lab[rank[0]]} ({_fmt(means[rank[0]])}); "
                         f"last: {lab[rank[-1]]} ({_fmt(means[rank[-1]])}).")
            het = [m for m in rank if not _ws(methods[m])]
            lines.append(f"- Among the representation-exchange methods CreamFL ranks {het.index('creamfl') + 1} "
                         f"of {len(het)}; their means span {means[het[-1]][0]:.1f} to {means[het[0]][0]:.1f}.")
            ref = _m(b.vals("t1", SERVER_ALONE, st, key=KEY))
            if ref is not None:
                above = [m for m in rank if means[m][0] > ref[0]]
                lines.append(f"- The server alone (public pairs only) reaches {_fmt(ref)}; {len(above)} of "
                             f"{len(rank)} methods are above it in the mean"
                             + (f" ({', '.join(lab[m] for m in above)})" if above else "")
                             + " (the paired tests are in the section above).")
            sh = _m(b.vals("t1", SHARED_ADAM, st, key=KEY))
            if sh is not None:
                lines.append(f"- CreamFL with one Adam for both server phases (the authors' optimizer): {_fmt(sh)} "
                             f"against {_fmt(means['creamfl'])} with the phases' momentum restarted (the default).")
        mb = {m: _m(b.vals("t1", m, st, key="_mb_round")) for m in ("creamfl", "creamfl_fedavg", "reamfl_iot")
              if m in methods}
        if mb.get("creamfl") and mb.get("creamfl_fedavg"):
            lines.append(f"- Bytes per round (up + down): CreamFL {mb['creamfl'][0]:.2f} MB, FedAvg/FedIoT "
                         f"{mb['creamfl_fedavg'][0]:.2f} MB ({mb['creamfl_fedavg'][0] / mb['creamfl'][0]:.1f}x CreamFL)"
                         + (f", reamFL+IoT {mb['reamfl_iot'][0]:.2f} MB (it sends no global representations down)"
                            if mb.get("reamfl_iot") else "") + ".")
        for ser, p in F4.fig4_series(b, st).items():
            if len(p) > 1:
                lines.append(f"- Fig. 4, {ser}: "
                             + ", ".join(f"{lab}: {y:.1f} ± {sd:.1f} ({x:.2f} MB/round)"
                                         for lab, x, y, sd, _, _ in p) + ".")
        out += lines + [""]
    return out


# ----------------------------------------------------------------------------- the report


def report(b) -> list[str]:
    p, root = b.params, b.grid.root
    quick = bool(p.get("quick"))
    finished = b.finished()
    run_s = sum((b.results.final(n, KEY) or {}).get("_wall", 0.0) for n in finished)
    failed = b.failed()
    out = [
        "# CreamFL benchmark (Tables 1, 2 and 3, Figure 4)" + (" — QUICK smoke run, not results" if quick else ""), "",
        regenerate_line(b, p["command"]), "",
        "## Scale", "",
        *H.scale_lines(b),
        f"- Rounds: {b.config('t1', None, next(iter(b.grid.settings('t1')))).get('rounds') or 'as in the configs'} (the configs have 8; the runs are otherwise "
        "the configs as they are, with `threads = 1` and the seed set).",
        "- Methods: every method with its registered defaults (`mmfl list`); nothing was tuned on these "
        "results. FedAvg / FedIoT (`creamfl_fedavg` / `creamfl_fediot`) give every client the server's "
        "architecture (the run drops `[[client_models]]`) and the public pairs to the image-text clients.",
        f"- Seeds {b.grid.groups['t1'].seeds} for every table, {b.grid.groups['fig4'].seeds} for Figure 4 (run seed: "
        "model init, client sampling, partition; the data sets' own splits are fixed); mean ± std (population "
        "std, ddof 0) over seeds.",
        "- Metrics: the server model's final-round Recall@K (%) on the setting's test pairs (a few hundred "
        "pairs, so a single R@1 step is a fraction of a point): **R@1_sum** = i2t R@1 + t2i R@1 on 5 strided "
        "fifths of the test pairs (mean over the folds) + i2t R@1 + t2i R@1 on all of them, the four-term sum of "
        "the paper's Table 1 (its 1K = 5 folds of 1,000 of COCO's 5,000 test images, its 5K = all; "
        "`mmfl.core.retrieval`, protocol \"fifths\": emoji 383 test pairs, folds of 76-77; mfeat 400, folds "
        "of 80); \"R@1 i2t+t2i (one gallery)\" = the two terms on all pairs (the figure this report called "
        "\"R@1 sum\" before issue 26). Paired tests and findings use R@1_sum.",
        f"- Machine: {machine()}.",
        runs_line(len(finished), len(b.runs), run_s, b.last_invocation()),
        "",
    ]
    out += problem_lines(failed)
    order_lines, summary = ordering(b)
    out += ["## Table 1 analog: cross-modal retrieval of the server model", "", *table1(b)]
    out += ["## Table 2 analog: visual question answering", "", *table2(b)]
    out += ["## Table 3 analog: ablation", "", *table3(b)]
    png = b.grid.report.parent / p["fig4_png"]
    out += ["## Figure 4 analog: communication vs performance", "",
            "x = total payload bytes up + down over the run (the paper plots the same per round; every run "
            "has the same number of rounds, so the shape is the same). Blue: public set size varied at the "
            "config's d; orange: d = model.feat_dim varied (the client models inherit it) with all public "
            "pairs; solid CreamFL, dashed reamFL+IoT; dotted: FedAvg / FedIoT at three server-model sizes.", ""]
    f4 = F4.fig4(b, png)
    drawn = png.exists() and any(F4.fig4_series(b, st) for st in b.grid.settings("fig4"))
    out += ([f"![fig4]({os.path.relpath(png, b.grid.report.parent)})", ""] if drawn else []) + f4
    out += ["## One rung toward the paper's regime", "", *R.rung(b)]
    out += ["## Does the paper's ordering hold?", "",
            "Computed from the runs above, paired by seed (the same seed gives both methods the same partition, "
            "initialisation and client sampling): a claim 'a > b' *holds* when the 95% percentile-bootstrap "
            "confidence interval of the mean per-seed difference lies above 0 and a paired t-test gives "
            "p < 0.05, is **reversed** when both say the opposite, and is *unresolved* otherwise "
            "(`mmfl.sweep.paired_verdict`).", "", *summary, "", *order_lines]
    out += ["## Findings (generated from the numbers above)", "", *findings(b)]
    out += reading_lines(root / p["analysis"] if p.get("analysis") else None)
    return out + [""]
