"""PartialFL benchmark tables (grid: grid.toml): Fig. 2 / Fig. 4 per setting and global model,
Table 2 (label skew), Table 3 (fraction q of clients with the shareable modality), the digits
Dirichlet split, communication, the paper's orderings, findings. Rows iterate over the grid's
methods; the claims checked (FIG_CLAIMS) and the paper's numbers are the paper's named choices.
Post-run step: split learning with private-only clients is evaluated on the private modality
alone (``post`` -> ``eval_private.json``)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np

from mmfl.bench import finite, ms, verdict_count
from mmfl.sweep import machine, spread_text, verdict

HERE = Path(__file__).resolve().parent
FILES = ("eval_private.json",)
SETTING_TITLE = {"digits": "spoken digits: FSDD audio (private) + MNIST image (shareable), one client per speaker",
                 "emoji": "emoji: image (private) + name embedding (shareable), 99 subcategories, Dirichlet"}
# the paper's metric per setting: UAR for speech (IEMOCAP / MSP-Improv), top-5 for Food-101
PRIMARY = {"digits": "uar", "emoji": "accuracy_top5"}
METRICS = [("uar", "UAR"), ("accuracy", "top-1"), ("accuracy_top5", "top-5")]
VARIANTS = ["private", "both"]
VLABEL = {"private": "uni-modal global model (private modality only)",
          "both": "multimodal global model (both modalities, fusion sum)"}
# The paper's claims (Fig. 2 / Fig. 4 as pairwise orderings "a > b"; the figures' numbers are
# not printed, the text gives some gaps, quoted in the report).
FIG_CLAIMS = [("pfl_centralized", "split_learning"), ("pfl_centralized", "partialfl"),
              ("split_learning", "partialfl"), ("split_learning", "partialfl_prox"),
              ("partialfl", "pfl_fedavg"), ("partialfl_prox", "pfl_fedprox"),
              ("pfl_fedprox", "pfl_fedavg"), ("partialfl_prox", "partialfl")]
# Table 2 (UPMC Food-101, top-5 %, FL = FedProx there): (variant, alpha) -> (FL, PartialFL)
PAPER_T2 = {("private", 1.0): (51.08, 53.03), ("private", 0.5): (48.27, 51.20), ("private", 0.1): (36.20, 39.54),
            ("both", 1.0): (56.04, 58.62), ("both", 0.5): (52.91, 55.94), ("both", 0.1): (40.68, 43.74)}
# Table 3 (uni-modal global model): emoji <- Food-101 alpha 0.5 top-5, digits <- IEMOCAP UAR
PAPER_T3 = {"emoji": {1.0: 51.2, 0.5: 50.94, 0.25: 50.31, 0.0: 48.27},
            "digits": {1.0: 61.30, 0.5: 59.37, 0.0: 56.93}}
PAPER_T3_SRC = {"emoji": "Food-101, alpha 0.5, top-5", "digits": "IEMOCAP, UAR"}


# ----------------------------------------------------------------------------- post-run evaluation


def _private_only(raw: dict) -> list[str] | None:
    """Split learning with clients holding the private modality only: evaluate on it only."""
    if raw["algorithm"]["name"] in ("split_learning", "split_learning_u") and \
            raw.get("modalities", {}).get("name") == "mixed":
        return list(raw["modalities"]["modalities"])
    return None


def done(run_dir: Path, raw: dict) -> bool:
    return (run_dir / "summary.json").exists() and (_private_only(raw) is None
                                                     or (run_dir / "eval_private.json").exists())


def post(raw: dict, cfg, run_dir: Path, exp) -> None:
    """Split learning with private-only clients: the split model on the private modality
    alone (the shareable slot: zeros, as in training), into eval_private.json."""
    from mmfl.core.training import evaluate_model

    mods = _private_only(raw)
    if mods is not None:
        row = evaluate_model(exp.server.model, exp.federation.test.with_features(mods),
                             num_classes=exp.federation.meta.num_classes)
        row = {k: v for k, v in row.items() if not k.startswith("class_accuracy")}
        (run_dir / "eval_private.json").write_text(json.dumps(row, indent=1))


# ----------------------------------------------------------------------------- readings


def context(b) -> dict:
    """What the sections read off the grid: seeds, settings, the fig methods and their labels,
    each group's rows, the base config of each setting."""
    from mmfl.config import load_raw

    g = b.grid
    fig = g.settings("fig")
    settings = list(dict.fromkeys(e.info["setting"] for e in fig.values()))
    s = {"b": b, "seeds": g.seeds, "settings": settings, "groups": ["fig", "t2", "t3", "dir"], "methods": list(b.methods("fig")),
         "label": {m: e.label for m, e in b.methods("fig").items()},
         "split": [m for m, e in b.methods("fig").items() if e.info.get("split")],
         "t2_methods": list(b.methods("t2")), "dir_methods": list(b.methods("dir")),
         "t2_betas": list(dict.fromkeys(e.info["beta"] for k, e in g.settings("t2").items()
                                        if b.names("t2", "pfl_fedavg", k))),
         "t3_q": {}, "t3_methods": {}, "config": {}, "base": {}, "dir_partition": b.config("dir", setting="private")[
             "partition"], "dir_per_round": b.config("dir", setting="private")["clients_per_round"]}
    for st in settings:
        key = f"{st}-private"
        path = fig[key].config[0]
        s["config"][st] = os.path.relpath(path, g.root)
        base = load_raw(path)
        base["threads"] = 1
        base["rounds"] = b.config("fig", setting=key)["rounds"]
        s["base"][st] = base
        rows: dict[float, list[str]] = {}
        for m, e in b.methods(f"t3_{st}").items():
            if b.names(f"t3_{st}", m):
                rows.setdefault(e.info["q"], []).append(e.token)
        s["t3_q"][st], s["t3_methods"][st] = list(rows), rows
    return s


def fig_names(setting, method, variant, s, beta=None, q=None, dirichlet=False) -> list[str]:
    """Run names (seed order) of one table cell."""
    b = s["b"]
    if beta is not None:
        key = next(k for k, e in b.grid.settings("t2").items() if e.info == {"variant": variant, "beta": beta})
        return list(b.names("t2", method, key).values())
    if q is not None:
        g = f"t3_{setting}"
        m = next(k for k, e in b.methods(g).items() if e.token == method and e.info["q"] == q)
        return list(b.names(g, m).values())
    if dirichlet:
        return list(b.names("dir", method, variant).values())
    return list(b.names("fig", method, f"{setting}-{variant}").values())


def _final(b, name: str) -> dict | None:
    """The final row (split learning on the private modality: its eval_private.json over it)
    with PartialFL's byte readings: the first round's upload, the later rounds', split
    learning's bytes per epoch and messages."""
    out = b.results.final(name)
    rows = b.results.rows(name)
    if out is None or not [r for r in rows if "accuracy" in r]:
        return None
    out = dict(out)
    up = [r.get("bytes_up", 0) for r in rows]
    out["_mb_first_up"] = up[0] / 1e6 if up else 0.0
    out["_mb_later_up"] = float(np.mean(up[1:])) / 1e6 if len(up) > 1 else float("nan")
    bpe = [r["bytes_per_epoch"] for r in rows if "bytes_per_epoch" in r]
    out["_mb_epoch"] = float(np.mean(bpe)) / 1e6 if bpe else None
    out["_msgs"] = float(np.mean([r["messages"] for r in rows if "messages" in r])) if bpe else None
    out["_nonfinite"] = [k for k in ("uar", "accuracy", "accuracy_top5", "test_loss") if k in out
                         and not finite(out[k])] + (["train_loss"] if any(
                             "train_loss" in r and not finite(r["train_loss"]) for r in rows) else [])
    return out


def _vals(b, names: list[str], key: str) -> list[float]:
    return [float(r[key]) for n in names if (r := _final(b, n)) is not None and finite(r.get(key))]


def _ms(vals: list[float], n_expected: int, key: str = "uar", digits: int = 1) -> str:
    return ms(vals, n_expected, digits, 1.0 if key.startswith("_") else 100.0)


def _mstr(b, names, key, n) -> str:
    return _ms(_vals(b, names, key), n, key)


def _verdict(a: list[float], b: list[float]) -> tuple[float, float, str]:
    """A claim 'a > b' on fractions, in points."""
    return verdict(a, b, scale=100.0)


_count = verdict_count


def num_clients(setting: str, s: dict) -> int:
    from mmfl.config import resolve
    from mmfl.data.federation import build_federation

    return build_federation(resolve(base_raw(setting, s))).num_clients


def base_raw(setting: str, s: dict) -> dict:
    """The setting's config file with the grid's threads and the setting's rounds."""
    return copy.deepcopy(s["base"][setting])


def modalities_of(setting: str, s: dict) -> tuple[str, str]:
    """(shareable S, private P) of a setting, from its config's [algorithm] and [privacy]."""
    raw = s["base"][setting]
    p = next(m for m, rule in raw["privacy"]["modalities"].items() if rule == "private")
    return raw["algorithm"]["shareable"], p


def pooled_upload(setting: str, s: dict) -> str:
    """Size of the raw training data a centralized run would collect (float32 features, int64 labels)."""
    from mmfl.config import load_raw, resolve
    from mmfl.data import DATASETS

    cfg = resolve(load_raw(s["b"].grid.root / s["config"][setting]))
    d = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    share, priv = modalities_of(setting, s)
    n = len(d.train)
    size = {m: d.train.features[m][0].numel() * 4 * n for m in (share, priv)}
    lab = 8 * n
    return (f"{setting} {(size[priv] + lab) / 1e6:.1f} MB uni-modal ({priv} + labels), "
            f"{(size[priv] + size[share] + lab) / 1e6:.1f} MB multimodal")


# ----------------------------------------------------------------------------- report sections


def fig_section(s, raw) -> tuple[list[str], list[str]]:
    """Fig. 2 / 4 tables per setting and global model; claim checks; summary lines."""
    LABEL = s["label"]
    out, summary = [], []
    n = len(s["seeds"])
    for setting in s["settings"]:
        prim = PRIMARY[setting]
        for variant in VARIANTS:
            out += [f"### {setting}, {VLABEL[variant]}", "",
                    f"{SETTING_TITLE[setting]}. Final round, test set, % (mean ± std over seeds {s['seeds']}). "
                    "MB = engine payload bytes (10^6) per round, mean over rounds, the round's whole cohort.", "",
                    "| method | UAR | top-1 | top-5 | MB up / round | MB down / round | MB / epoch (split) "
                    "| messages / round |",
                    "|---|---|---|---|---|---|---|---|"]
            for m in s["methods"]:
                names = fig_names(setting, m, variant, s)
                cells = [_mstr(raw, names, k, n) for k, _ in METRICS]
                prim_i = [k for k, _ in METRICS].index(prim)
                cells[prim_i] = f"**{cells[prim_i]}**"
                if m == "pfl_centralized":
                    up = down = "n/a ¹"
                else:
                    up = _ms(_vals(raw, names, "_mb_up"), n, "_", 2)
                    down = _ms(_vals(raw, names, "_mb_down"), n, "_", 2)
                ep = _ms(_vals(raw, names, "_mb_epoch"), n, "_", 2) if m in s["split"] else "—"
                msgs = _ms(_vals(raw, names, "_msgs"), n, "_", 0) if m in s["split"] else "—"
                out.append(f"| {LABEL[m]} | " + " | ".join(cells) + f" | {up} | {down} | {ep} | {msgs} |")
            out.append("")
            vals = {m: _vals(raw, fig_names(setting, m, variant, s), prim) for m in s["methods"]}
            vals = {m: v for m, v in vals.items() if v}
            if vals:
                rank = sorted(vals, key=lambda m: -np.mean(vals[m]))
                summary.append(f"- **{setting}, {variant}** ({dict(METRICS)[prim]}): "
                               + " > ".join(f"{LABEL[m]} ({100 * np.mean(vals[m]):.1f})" for m in rank) + ".")
                out += [f"Paper's ordering on {dict(METRICS)[prim]} (Fig. 2 / Fig. 4 text: Centralized best, split "
                        "learning the decentralized upper bound, PartialFL above FL, FedProx above FedAvg):", "",
                        "| claim | Δ (points) | spread (std a + std b) | here |", "|---|---|---|---|"]
                verdicts = []
                for a, b in FIG_CLAIMS:
                    if a in vals and b in vals:
                        d, sp, v = _verdict(vals[a], vals[b])
                        verdicts.append(v)
                        out.append(f"| {LABEL[a]} > {LABEL[b]} | {d:+.1f} | {spread_text(sp)} | {v} |")
                out.append("")
                if verdicts:
                    summary.append("  " + _count(verdicts, "Fig. 2/4"))
    out += ["¹ Centralized is one pooled client: its engine byte count is a one-client FedAvg's "
            "weights and means nothing; it would upload the whole training set (private modality and "
            "labels included) once: " + "; ".join(pooled_upload(setting, s) for setting in s["settings"]) + ".", ""]
    return out, summary

def t2_section(s, raw) -> tuple[list[str], list[str]]:
    if "t2" not in s["groups"] or "emoji" not in s["settings"]:
        return [], []
    n = len(s["seeds"])
    setting = "emoji"
    out = ["Emoji, Dirichlet beta (the paper's alpha) varied; FL = `pfl_fedavg`, PartialFL = `partialfl` "
           "(FedAvg aggregation; the paper's Table 2 uses FedProx for both). %, mean ± std over seeds "
           f"{s['seeds']}; beta 0.5 rows are the Fig. 4 runs.", "",
           "| global model | beta | method | UAR | top-1 | **top-5** | paper top-5 (Food-101) |",
           "|---|---|---|---|---|---|---|"]
    lines, summary, verdicts = [], [], []
    for variant in VARIANTS:
        for beta in s["t2_betas"]:
            for i, m in enumerate(s["t2_methods"]):
                names = fig_names(setting, m, variant, s, beta=beta)
                cells = [_mstr(raw, names, k, n) for k, _ in METRICS]
                paper = PAPER_T2.get((variant, beta))
                out.append(f"| {variant} | {beta:g} | {'FL' if i == 0 else 'PartialFL'} | " + " | ".join(cells)
                           + (f" | {paper[i]:.2f} |" if paper else " | — |"))
    out.append("")
    lines += ["| claim (top-5) | Δ (points) | spread | here |", "|---|---|---|---|"]
    gaps = {}
    for variant in VARIANTS:
        fl = {b: _vals(raw, fig_names(setting, "pfl_fedavg", variant, s, beta=b), "accuracy_top5")
              for b in s["t2_betas"]}
        pf = {b: _vals(raw, fig_names(setting, "partialfl", variant, s, beta=b), "accuracy_top5")
              for b in s["t2_betas"]}
        for b in s["t2_betas"]:
            if fl[b] and pf[b]:
                d, sp, v = _verdict(pf[b], fl[b])
                verdicts.append(v)
                gaps[(variant, b)] = d
                lines.append(f"| {variant}, beta {b:g}: PartialFL > FL | {d:+.1f} | {spread_text(sp)} | {v} |")
        bs = sorted(s["t2_betas"], reverse=True)
        for lab, series in (("FL", fl), ("PartialFL", pf)):
            for hi, lo in zip(bs, bs[1:]):
                if series[hi] and series[lo]:
                    d, sp, v = _verdict(series[hi], series[lo])
                    verdicts.append(v)
                    lines.append(f"| {variant}, {lab}: beta {hi:g} > beta {lo:g} | {d:+.1f} | {spread_text(sp)} | {v} |")
    lines.append("")
    for variant in VARIANTS:
        g = {b: gaps[(variant, b)] for b in s["t2_betas"] if (variant, b) in gaps}
        if len(g) > 1:
            hi, lo = max(g), min(g)
            lines.append(f"- {variant}: PartialFL − FL (top-5) is " + ", ".join(f"{g[b]:+.1f} at beta {b:g}"
                                                                              for b in sorted(g, reverse=True))
                         + f"; the paper's gap grows from the IID-most to the most skewed setting "
                         f"({'so does this one' if g[lo] > g[hi] else 'this one does not'}: "
                         f"{g[hi]:+.1f} at {hi:g} vs {g[lo]:+.1f} at {lo:g}).")
    if verdicts:
        summary.append("- **emoji, Table 2**: " + _count(verdicts, "Table 2"))
    return out + ["Checks:", ""] + lines + [""], summary


def dir_section(s, raw) -> tuple[list[str], list[str]]:
    """The digits Dirichlet split next to the speaker split, FL vs PartialFL."""
    LABEL = s["label"]
    if "dir" not in s["groups"] or "digits" not in s["settings"]:
        return [], []
    n, setting = len(s["seeds"]), "digits"
    d = s["dir_partition"]
    out = [f"Digits with a Dirichlet({d['beta']:g}) label split over {d['num_clients']} clients, {s['dir_per_round']} per "
           "round (same data, model and rounds as the speaker split; the speaker split's rows are the Fig. 2 "
           f"runs). %, mean ± std over seeds {s['seeds']}.", "",
           "| global model | split | method | **UAR** | top-1 | top-5 |", "|---|---|---|---|---|---|"]
    lines, summary, verdicts = ["| claim (UAR) | Δ (points) | spread | here |", "|---|---|---|---|"], [], []
    for variant in VARIANTS:
        for split, kw in (("speaker (6)", {}), (f"Dirichlet ({d['num_clients']})", {"dirichlet": True})):
            vals = {}
            for m in s["dir_methods"]:
                names = fig_names(setting, m, variant, s, **kw)
                vals[m] = _vals(raw, names, "uar")
                out.append(f"| {variant} | {split} | {LABEL[m]} | "
                           + " | ".join(_mstr(raw, names, k, n) for k, _ in METRICS) + " |")
            if all(vals.values()):
                dd, sp, v = _verdict(vals["partialfl"], vals["pfl_fedavg"])
                verdicts.append(v)
                lines.append(f"| {variant}, {split}: PartialFL > FedAvg | {dd:+.1f} | {spread_text(sp)} | {v} |")
    out.append("")
    if verdicts:
        summary.append("- **digits, Dirichlet split**: " + _count(verdicts, "PartialFL > FL"))
    return out + lines + [""], summary


def t3_section(s, raw) -> tuple[list[str], list[str]]:
    LABEL = s["label"]
    if "t3" not in s["groups"]:
        return [], []
    n = len(s["seeds"])
    out, summary = [], []
    for setting in s["settings"]:
        prim = PRIMARY[setting]
        k = num_clients(setting, s)
        qs = s["t3_q"][setting]
        out += [f"### {setting} (uni-modal global model; paper: {PAPER_T3_SRC[setting]})", "",
                "| method | q | clients with the shareable modality | UAR | top-1 | top-5 | MB up, round 1 | paper |",
                "|---|---|---|---|---|---|---|---|"]
        vals = {}
        for q in qs:
            for m in s["t3_methods"][setting][q]:
                names = fig_names(setting, m, "private", s, q=q)
                cells = [_mstr(raw, names, key, n) for key, _ in METRICS]
                pi = [key for key, _ in METRICS].index(prim)
                cells[pi] = f"**{cells[pi]}**"
                vals[(m, q)] = _vals(raw, names, prim)
                first = _ms(_vals(raw, names, "_mb_first_up"), n, "_", 2)
                paper = PAPER_T3[setting].get(q) if m == "partialfl" else (PAPER_T3[setting][0.0] if q == 0.0 else None)
                out.append(f"| {LABEL[m]} | {q:g} | {int(round(q * k))} of {k} | " + " | ".join(cells)
                           + f" | {first} | {'—' if paper is None else f'{paper:.2f}'} |")
        out += ["", "(The paper's q = 0% row is its FL baseline; q = 0 PartialFL here runs the PartialFL code "
                "with no client uploading anything, and FedAvg at q = 1 and q = 0 should agree: its uni-modal "
                "global model never reads the shareable modality.)", "",
                "| claim | Δ (points) | spread | here |", "|---|---|---|---|"]
        verdicts = []
        pq = [q for q in sorted(qs, reverse=True) if vals.get(("partialfl", q))]
        for hi, lo in zip(pq, pq[1:]):
            d, sp, v = _verdict(vals[("partialfl", hi)], vals[("partialfl", lo)])
            verdicts.append(v)
            out.append(f"| PartialFL: q {hi:g} > q {lo:g} | {d:+.1f} | {spread_text(sp)} | {v} |")
        if vals.get(("partialfl", 1.0)) and vals.get(("pfl_fedavg", 1.0)):
            d, sp, v = _verdict(vals[("partialfl", 1.0)], vals[("pfl_fedavg", 1.0)])
            verdicts.append(v)
            out.append(f"| PartialFL q 1 > FedAvg | {d:+.1f} | {spread_text(sp)} | {v} |")
        out.append("")
        eq = []
        for a, b in ((("pfl_fedavg", 1.0), ("pfl_fedavg", 0.0)), (("partialfl", 0.0), ("pfl_fedavg", 0.0))):
            if vals.get(a) and vals.get(b):
                diff = max(abs(x - y) for x, y in zip(vals[a], vals[b])) * 100 if len(vals[a]) == len(vals[b]) \
                    else float("nan")
                eq.append(f"{LABEL[a[0]]} q={a[1]:g} vs {LABEL[b[0]]} q={b[1]:g}: means "
                          f"{100 * np.mean(vals[a]):.2f} / {100 * np.mean(vals[b]):.2f}, largest per-seed "
                          f"difference {diff:.2f} points")
        if eq:
            out += ["Equality checks: " + "; ".join(eq) + ".", ""]
        if verdicts:
            summary.append(f"- **{setting}, Table 3** ({dict(METRICS)[prim]}): " + _count(verdicts, "Table 3"))
    return out, summary


def comm_section(s, raw) -> list[str]:
    LABEL = s["label"]
    n = len(s["seeds"])
    out = ["Engine payload bytes (10^6), mean over seeds; per round = mean over rounds of the whole "
           "cohort's traffic. PartialFL's round 1 also carries the one-time upload of the shareable "
           "modality by *every* client holding it (Alg. 1 l. 2-5); every round carries F_g both ways, "
           "z_T down and z'_T up. Split learning: per batch, activations + labels up and "
           "gradients down, plus the client-side weights handed from client to client; its MB / epoch is "
           "the round's bytes / local_epochs (1 here).", "",
           "| setting | global model | method | MB up round 1 | MB up / later round | MB down / round "
           "| MB total (run) | run wall s |", "|---|---|---|---|---|---|---|---|"]
    for setting in s["settings"]:
        for variant in VARIANTS:
            for m in s["methods"]:
                if m == "pfl_centralized":
                    continue
                names = fig_names(setting, m, variant, s)
                out.append(f"| {setting} | {variant} | {LABEL[m]} | "
                           + " | ".join(_ms(_vals(raw, names, k), n, "_", 2 if k != "_wall" else 0)
                                        for k in ("_mb_first_up", "_mb_later_up", "_mb_down", "_mb_total",
                                                  "_wall")) + " |")
    out.append("")
    return out


def findings(s, raw) -> list[str]:
    """Statements read off the numbers (no interpretation)."""
    LABEL = s["label"]
    out = []
    for setting in s["settings"]:
        prim = PRIMARY[setting]
        name = dict(METRICS)[prim]
        for variant in VARIANTS:
            m = {k: _vals(raw, fig_names(setting, k, variant, s), prim) for k in s["methods"]}
            m = {k: v for k, v in m.items() if v}
            if not m:
                continue
            mean = {k: 100 * float(np.mean(v)) for k, v in m.items()}
            std = {k: 100 * float(np.std(v)) for k, v in m.items()}
            fl = [k for k in ("pfl_fedavg", "pfl_fedprox") if k in mean]
            pf = [k for k in ("partialfl", "partialfl_prox") if k in mean]
            parts = []
            if fl and pf:
                best_fl, best_pf = max(fl, key=mean.get), max(pf, key=mean.get)
                parts.append(f"best PartialFL ({LABEL[best_pf]}, {mean[best_pf]:.1f} ± {std[best_pf]:.1f}) vs best "
                             f"FL ({LABEL[best_fl]}, {mean[best_fl]:.1f} ± {std[best_fl]:.1f}): "
                             f"{mean[best_pf] - mean[best_fl]:+.1f} points")
            for ref in ("pfl_centralized", "split_learning"):
                if ref in mean and pf:
                    best_pf = max(pf, key=mean.get)
                    parts.append(f"{LABEL[ref]} {mean[ref]:.1f} ± {std[ref]:.1f}, {mean[ref] - mean[best_pf]:+.1f} "
                                 f"vs best PartialFL")
            if parts:
                out.append(f"- **{setting}, {variant}** ({name}): " + "; ".join(parts) + ".")
        # multimodal vs uni-modal global model
        diffs = []
        for k in s["methods"]:
            a = _vals(raw, fig_names(setting, k, "both", s), prim)
            b = _vals(raw, fig_names(setting, k, "private", s), prim)
            if a and b:
                diffs.append(f"{LABEL[k]} {100 * (np.mean(a) - np.mean(b)):+.1f}")
        if diffs:
            out.append(f"- **{setting}**: multimodal − uni-modal global model ({name}, points): "
                       + ", ".join(diffs) + ".")
        sl = _vals(raw, fig_names(setting, "split_learning", "private", s), "_mb_round")
        su = _vals(raw, fig_names(setting, "split_learning_u", "private", s), "_mb_round")
        fa = _vals(raw, fig_names(setting, "pfl_fedavg", "private", s), "_mb_round")
        pfb = _vals(raw, fig_names(setting, "partialfl", "private", s), "_mb_total")
        fab = _vals(raw, fig_names(setting, "pfl_fedavg", "private", s), "_mb_total")
        if sl and fa:
            out.append(f"- **{setting}** bytes, uni-modal: split learning {np.mean(sl):.2f} MB / round vs FedAvg "
                       f"{np.mean(fa):.2f} MB / round ({np.mean(sl) / np.mean(fa):.2f}x)"
                       + (f", U-shaped split learning {np.mean(su):.2f} MB / round "
                          f"({np.mean(su) / np.mean(fa):.2f}x)" if su else "")
                       + (f"; PartialFL's whole run {np.mean(pfb):.1f} MB vs FedAvg's {np.mean(fab):.1f} MB "
                          f"({np.mean(pfb) / np.mean(fab):.2f}x)" if pfb and fab else "") + ".")
    return out


def scale_lines(s) -> list[str]:
    from mmfl.config import resolve

    out = []
    for setting in s["settings"]:
        cfg = resolve(base_raw(setting, s))
        share, priv = modalities_of(setting, s)
        part = cfg.partition
        pdesc = part.name + (f", beta {part.params.beta}" if hasattr(part.params, "beta") else "")
        k = num_clients(setting, s)
        mv = cfg.model.values
        a = cfg.algorithm.params
        dp = ", ".join(f"{kk}={v}" for kk, v in vars(cfg.data.params).items()
                       if kk in ("num_train", "num_test", "label", "public_fraction"))
        out.append(f"- **{setting}** (`{s['config'][setting]}`): data `{cfg.data.name}` ({dp}); "
                   f"private `{priv}`, shareable `{share}`; {k} clients ({pdesc}), {cfg.run.clients_per_round} per "
                   f"round; {cfg.run.rounds} rounds; model multimodal feat_dim {mv.get('feat_dim')}, "
                   + ", ".join(f"{kk} {mv[kk]}" for kk in ("cnn_channels", "mlp_hidden") if kk in mv)
                   + f", fusion {mv.get('fusion')}; {cfg.train.optimizer} lr {cfg.train.lr}, batch "
                   f"{cfg.train.batch_size}, {cfg.train.local_epochs} local epoch; PartialFL beta {a.beta}, "
                   f"tau {a.tau}, server lr {a.server_lr}; FedProx mu 0.01.")
    return out


def report(b) -> list[str]:
    s, raw = context(b), b
    quick = b.params.get("quick", False)
    planned = [(r.name, r.raw) for r in b.runs]
    finished = [n for n, r in planned if done(b.raw / n, r)]
    failed = sorted((p.parent.name, p.read_text().strip()) for p in b.raw.glob("*/failed.txt")
                    if p.parent.name in {n for n, _ in planned})
    nonfinite = []
    run_s = 0.0
    for n in finished:
        r = _final(raw, n) or {}
        run_s += r.get("_wall", 0.0)
        if r.get("_nonfinite"):
            nonfinite.append((n, r["_nonfinite"]))
    last = b.last_invocation()
    cmd = b.params["command"]
    out = [
        "# PartialFL benchmark (paper 003: Fig. 2 / Fig. 4, Tables 2 and 3)"
        + (" — QUICK smoke run, not results" if quick else ""), "",
        f"Regenerate: `{cmd}` (finished runs in `{os.path.relpath(b.raw, b.grid.root)}/` are reused; `--tables-only` "
        "rebuilds this file; `--workers N` sets the worker processes).", "",
        "## Scale", "",
        *scale_lines(s),
        "- Methods: `pfl_centralized` (one pooled client: the upper bound; it presupposes collecting the private "
        "modality and the labels, which the privacy premise forbids, and the engine's privacy check cannot see "
        "it because the pooling happens before any message), `split_learning` (vanilla, sequential over the "
        "round's cohort; it uploads labels, so these runs set `privacy.labels = \"shareable\"`), "
        "`split_learning_u` (U-shaped, not in the paper: the client keeps the encoders and the classifier, the "
        "server the projectors and the fusion, so the labels stay private), `pfl_fedavg`, "
        "`pfl_fedprox` (mu 0.01), `partialfl`, `partialfl_prox`; every other run has the configs' `[privacy]` "
        "with the labels and the private modality private, checked on every reply. Registered defaults, "
        "nothing tuned on these results (the paper tunes tau in {0.05, 0.1, 0.2} and beta in {0.001, 0.01} "
        "and reports the best; here tau 0.1, beta 0.01).",
        "- Test sets: digits, 1,000 MNIST test digits paired with FSDD test takes (0-4) of the same 6 speakers "
        "(the paper tests on held-out sessions); emoji, 20% of the emoji held out by emoji (380 pairs, one of "
        "the 99 subcategories absent, so UAR averages over 98).",
        "- Uni-modal split learning: every client holds the private modality only, the cut is after its "
        "projector (U-shaped: after its encoder and after the fusion); the final server model is evaluated on the test set's private modality alone "
        "(`eval_private.json` in the run folder).",
        f"- Seeds {s['seeds']} (run seed: model init, client sampling, Dirichlet partition; the data sets' "
        "own splits are fixed; the speaker split is the data's); mean ± std (population, ddof 0) over seeds.",
        "- Metrics: the global model's final-round test UAR (unweighted average recall = macro recall over "
        "the classes present in the test set, the paper's speech metric), top-1 and top-5 accuracy (the "
        "paper's Food-101 metric), in %. Bold: the paper's metric for the setting.",
        f"- Machine: {machine()}.",
        f"- Runs: {len(finished)} of {len(planned)} planned finished; summed run time {run_s / 60:.1f} min of "
        "single-thread compute (the rounds' wall times)"
        + (f"; the last invocation ran {last['runs']} runs in {last['wall_s'] / 60:.1f} min wall with "
           f"{last['workers']} workers (load average at its start: "
           f"{' '.join(f'{x:.1f}' for x in last['load_average_at_start'] or [])})" if last else "") + ".",
        "",
    ]
    if failed:
        out += [f"**Failed runs** ({len(failed)}; the error, and `{cmd}` reruns them):", ""] \
            + [f"- `{n}`: {e}" for n, e in failed] + [""]
    if nonfinite:
        out += [f"**Runs with non-finite metrics** ({len(nonfinite)}):", ""] \
            + [f"- `{n}`: {', '.join(k)}" for n, k in nonfinite] + [""]
    summary = []
    if "fig" in s["groups"]:
        lines, summ = fig_section(s, raw)
        summary += summ
        out += ["## Fig. 2 / Fig. 4 analog: centralized, split learning, FL and PartialFL", "",
                "The paper (text of Sect. 3 and App. E.1): on Food-101, uni-modal, PartialFL beats the FL baseline "
                "by 1.95 points top-5, split learning beats PartialFL by 1.76, FedProx beats FedAvg by about 4; "
                "multimodal, PartialFL beats FL by 2.58; on IEMOCAP PartialFL beats FL by nearly 4 points UAR; "
                "centralized is best everywhere.", "", *lines]
    if "t2" in s["groups"]:
        lines, summ = t2_section(s, raw)
        summary += summ
        out += ["## Table 2 analog: label skew", "", *lines]
    if "t3" in s["groups"]:
        lines, summ = t3_section(s, raw)
        summary += summ
        out += ["## Table 3 analog: fraction q of clients holding the shareable modality", "", *lines]
    if "dir" in s["groups"]:
        lines, summ = dir_section(s, raw)
        summary += summ
        out += ["## Digits with a Dirichlet split", "", *lines]
    if "fig" in s["groups"]:
        out += ["## Communication", "", *comm_section(s, raw)]
    out += ["## Does the paper's ordering hold?", "",
            "Computed from the tables above: a claim 'a > b' *holds beyond the spread* when "
            "mean(a) − mean(b) > std(a) + std(b), *within the spread* when it is positive but smaller; "
            "likewise *reversed*.", "", *summary, ""]
    out += ["## Findings (generated from the numbers above)", "", *findings(s, raw), ""]
    analysis = HERE / "analysis.md"
    if analysis.exists() and not quick:
        out += ["## Reading the results", "", analysis.read_text().strip(), ""]
    return out + [""]
