"""PartialFL paper benchmark (paper 003: Fig. 2 / Fig. 4, Tables 2 and 3) on two small
settings with a shareable and a private modality, scaled to about an hour on 2 CPU cores.

    .venv/bin/python benchmarks/partialfl/run.py               # everything -> benchmarks/results/partialfl.md
    .venv/bin/python benchmarks/partialfl/run.py --quick       # a few-minute smoke version
    .venv/bin/python benchmarks/partialfl/run.py --tables-only # rebuild the report from finished runs

Settings (the configs as they are, except ``threads = 1``, the run's ``seed`` and ``rounds``:
50 for digits and 80 for emoji here, 3 in ``--quick``; the configs have 20 and 50):

- ``digits``: ``mmfl/configs/partialfl_digits.toml`` (the paper's speech setting): FSDD
  spoken digit (audio, private, biometric) + MNIST image of the same digit (shareable),
  one client per FSDD speaker (6), 3 per round; the paper reports UAR here;
- ``emoji``: ``mmfl/configs/partialfl_emoji.toml`` (the paper's UPMC Food-101 setting):
  emoji image (MobileNetV2 features, private) + its name (MiniLM embedding, shareable), 99
  subcategories, 30 clients with Dirichlet(0.5) label skew, 10 per round; the paper reports
  top-5 accuracy here.

Groups:

- ``fig``: Fig. 2 / Fig. 4 analog: pfl_centralized, split_learning, split_learning_u (U-shaped,
  not in the paper), pfl_fedavg, pfl_fedprox, partialfl, partialfl_prox, each with a uni-modal global model (the private modality only,
  ``algorithm.global_model = "private"``) and a multimodal one (``"both"``, fusion "sum"),
  seeds 0, 1, 2, both settings. Split learning: "both" = clients hold both modalities (the
  client side is both encoders + projectors, the server side the fusion and classifier);
  "private" = every client holds the private modality only (``[modalities] mixed`` with
  ``multimodal_fraction = 0``), and its final model is evaluated on the private modality
  only (the engine's own evaluation feeds the test set's shareable modality through the
  never-trained branch). Vanilla split learning uploads each batch's labels, so its runs set
  ``privacy.labels = "shareable"``; every other run (U-shaped split learning included) keeps
  the configs' ``labels = "private"``. U-shaped: same client sets; the cuts are after the
  encoders and after the fusion (client: encoders + classifier + heads, server: projectors +
  fusion).
  Centralized: one pooled client (the engine samples it every round) with the same model.
- ``t2``: Table 2 analog (emoji): Dirichlet beta (the paper's alpha) 1.0, 0.5, 0.1 for
  pfl_fedavg vs partialfl, both global models (beta 0.5 = the ``fig`` runs).
- ``t3``: Table 3 analog: the fraction q of clients holding the shareable modality (the
  others hold the private one only: ``[modalities] mixed``, ``multimodal_fraction = q``,
  ``modalities = [private]``), uni-modal global model; emoji q in {1, 0.5, 0.25, 0},
  digits q in {1, 0.5, 0} (the paper's speech values); partialfl at every q and
  pfl_fedavg at q = 1 and q = 0 (its uni-modal model never reads the shareable modality,
  so q should not change it: a check).
- ``dir``: the issue's second digits split: Dirichlet(0.5) label skew over 20 clients, 10 per
  round, instead of one client per speaker; pfl_fedavg vs partialfl, both global models.

A run's folder name is derived from its setting, method, global model, the overrides and
its seed. Runs go to ``benchmarks/results/raw/partialfl/<run>/``; a finished run
(summary.json exists) is not run again, so an interrupted benchmark continues where it
stopped (a failed run, with its failed.txt, is tried again). ``--workers`` worker processes
(spawn) with one torch thread each.

Cost: 141 runs (digits 63, emoji 78; 117 before split_learning_u and ``dir`` were added), estimated from the --quick runs' per-round times on a
shared machine (load ~4 on 2 cores, the runs at nice 19): about 115 min of single-thread compute
(digits 0.9-2.6 s per round, emoji 0.25-0.8 s), so roughly 45-60 minutes wall with 2 workers
on 2 cores (less when the cores are idle). ``--quick``: 33 runs of 3 rounds, 1 seed, about
2 minutes with 1 worker.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from mmfl.sweep import machine, run_missing, spread_text, verdict

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SETTINGS = {"digits": "mmfl/configs/partialfl_digits.toml", "emoji": "mmfl/configs/partialfl_emoji.toml"}
SETTING_TITLE = {"digits": "spoken digits: FSDD audio (private) + MNIST image (shareable), one client per speaker",
                 "emoji": "emoji: image (private) + name embedding (shareable), 99 subcategories, Dirichlet"}
# the paper's metric per setting: UAR for speech (IEMOCAP / MSP-Improv), top-5 for Food-101
PRIMARY = {"digits": "uar", "emoji": "accuracy_top5"}
METRICS = [("uar", "UAR"), ("accuracy", "top-1"), ("accuracy_top5", "top-5")]
METHODS = ["pfl_centralized", "split_learning", "split_learning_u", "pfl_fedavg", "pfl_fedprox", "partialfl",
           "partialfl_prox"]
SPLIT = ("split_learning", "split_learning_u")
LABEL = {"pfl_centralized": "Centralized", "split_learning": "Split learning",
         "split_learning_u": "Split learning, U-shaped", "pfl_fedavg": "FedAvg",
         "pfl_fedprox": "FedProx", "partialfl": "PartialFL + FedAvg", "partialfl_prox": "PartialFL + FedProx"}
VARIANTS = ["private", "both"]
VLABEL = {"private": "uni-modal global model (private modality only)",
          "both": "multimodal global model (both modalities, fusion sum)"}
T2_BETAS = [1.0, 0.5, 0.1]
T2_METHODS = ["pfl_fedavg", "partialfl"]
T3_Q = {"digits": [1.0, 0.5, 0.0], "emoji": [1.0, 0.5, 0.25, 0.0]}
# ``dir``: digits with a Dirichlet split over more clients (the second digits setting)
DIR_PARTITION = {"name": "dirichlet", "num_clients": 20, "beta": 0.5}
DIR_PER_ROUND = 10
DIR_METHODS = ["pfl_fedavg", "partialfl"]

FULL = dict(seeds=[0, 1, 2], rounds={"digits": 50, "emoji": 80}, settings=list(SETTINGS),
            groups=["fig", "t2", "t3", "dir"], methods=METHODS, t2_betas=T2_BETAS, t3_q=T3_Q)
QUICK = dict(seeds=[0], rounds={"digits": 3, "emoji": 3}, settings=list(SETTINGS),
             groups=["fig", "t2", "t3", "dir"],
             methods=METHODS, t2_betas=[0.5, 0.1], t3_q={"digits": [1.0, 0.0], "emoji": [1.0, 0.5, 0.0]},
             quick=True)

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


# ----------------------------------------------------------------------------- plan


def base_raw(setting: str, s: dict) -> dict:
    from mmfl.config import load_raw

    raw = load_raw(ROOT / SETTINGS[setting])
    raw["threads"] = 1
    raw["rounds"] = s["rounds"][setting]
    return raw


def modalities_of(setting: str) -> tuple[str, str]:
    """(shareable S, private P) of a setting, from its config's [algorithm] and [privacy]."""
    from mmfl.config import load_raw

    raw = load_raw(ROOT / SETTINGS[setting])
    s = raw["algorithm"]["shareable"]
    p = next(m for m, rule in raw["privacy"]["modalities"].items() if rule == "private")
    return s, p


def _fmt_v(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def make_run(setting: str, method: str, variant: str, seed: int, s: dict,
             beta: float | None = None, q: float | None = None, dirichlet: bool = False) -> tuple[str, dict]:
    """(run name, raw config). ``beta``: Dirichlet concentration (None or the config's: no tag);
    ``q``: share of clients holding the shareable modality (None or 1: all of them, no tag);
    ``dirichlet``: :data:`DIR_PARTITION` instead of the config's split (tag ``dir20``)."""
    raw = base_raw(setting, s)
    share, priv = modalities_of(setting)
    raw["seed"] = seed
    tags = []
    if method in SPLIT:
        raw["algorithm"] = {"name": method}
        if method == "split_learning":
            raw["privacy"]["labels"] = "shareable"  # vanilla split learning uploads each batch's labels
        if variant == "private":
            raw["modalities"] = {"name": "mixed", "multimodal_fraction": 0.0, "modalities": [priv]}
    else:
        raw["algorithm"]["name"] = method
        raw["algorithm"]["global_model"] = variant
        if variant == "both":
            raw["model"]["fusion"] = "sum"
    if dirichlet:
        raw["partition"] = dict(DIR_PARTITION)
        raw["clients_per_round"] = DIR_PER_ROUND
        tags.append(f"dir{DIR_PARTITION['num_clients']}")
    if beta is not None and beta != raw["partition"].get("beta"):
        raw["partition"]["beta"] = beta
        tags.append(f"beta={_fmt_v(beta)}")
    if q is not None and q < 1.0:
        raw["modalities"] = {"name": "mixed", "multimodal_fraction": q, "modalities": [priv]}
        tags.append(f"q={_fmt_v(q)}")
    name = "-".join([setting, method, variant, *tags, f"s{seed}"])
    raw["name"] = name
    return name, raw


def fig_names(setting, method, variant, s, **kw) -> list[str]:
    return [make_run(setting, method, variant, seed, s, **kw)[0] for seed in s["seeds"]]


def plan(s: dict) -> list[tuple[str, dict]]:
    runs: dict[str, dict] = {}
    for setting in s["settings"]:
        for seed in s["seeds"]:
            if "fig" in s["groups"]:
                for variant in VARIANTS:
                    for m in s["methods"]:
                        name, raw = make_run(setting, m, variant, seed, s)
                        runs.setdefault(name, raw)
            if "t2" in s["groups"] and setting == "emoji":
                for beta in s["t2_betas"]:
                    for variant in VARIANTS:
                        for m in T2_METHODS:
                            name, raw = make_run(setting, m, variant, seed, s, beta=beta)
                            runs.setdefault(name, raw)
            if "t3" in s["groups"]:
                for q in s["t3_q"][setting]:
                    for m in (["partialfl", "pfl_fedavg"] if q in (0.0, 1.0) else ["partialfl"]):
                        name, raw = make_run(setting, m, "private", seed, s, q=q)
                        runs.setdefault(name, raw)
            if "dir" in s["groups"] and setting == "digits":
                for variant in VARIANTS:
                    for m in DIR_METHODS:
                        name, raw = make_run(setting, m, variant, seed, s, dirichlet=True)
                        runs.setdefault(name, raw)
    return list(runs.items())


# ----------------------------------------------------------------------------- execution


def _needs_private_eval(raw: dict) -> list[str] | None:
    """Split learning with clients holding the private modality only: evaluate on it only."""
    if raw["algorithm"]["name"] in SPLIT and raw.get("modalities", {}).get("name") == "mixed":
        return list(raw["modalities"]["modalities"])
    return None


def _done(raw_dir: Path, name: str, raw: dict) -> bool:
    d = raw_dir / name
    return (d / "summary.json").exists() and (_needs_private_eval(raw) is None or (d / "eval_private.json").exists())


def _post(raw: dict, cfg, run_dir: Path, exp) -> None:
    """Split learning with private-only clients: the split model on the private modality
    alone (the shareable slot: zeros, as in training), into eval_private.json."""
    from mmfl.core.training import evaluate_model

    mods = _needs_private_eval(raw)
    if mods is not None:
        row = evaluate_model(exp.server.model, exp.federation.test.with_features(mods),
                             num_classes=exp.federation.meta.num_classes)
        row = {k: v for k, v in row.items() if not k.startswith("class_accuracy")}
        (run_dir / "eval_private.json").write_text(json.dumps(row, indent=1))


def execute(s: dict, raw_dir: Path, workers: int) -> int:
    return run_missing("partialfl", plan(s), raw_dir, workers, [base_raw(setting, s) for setting in s["settings"]],
                       done=lambda n, r: _done(raw_dir, n, r), post=_post)


# ----------------------------------------------------------------------------- results


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _final(raw: Path, name: str) -> dict | None:
    """The last evaluated row of a finished run (split learning on the private modality: its
    private-only evaluation), with bytes and time added."""
    from mmfl.report import load_metrics

    d = raw / name
    if not (d / "summary.json").exists():
        return None
    rows = load_metrics(d)
    evals = [r for r in rows if "accuracy" in r]
    if not evals:
        return None
    out = {k: v for k, v in evals[-1].items() if not k.startswith("class_accuracy")}
    if (d / "eval_private.json").exists():
        out.update(json.loads((d / "eval_private.json").read_text()))
        out["_private_eval"] = True
    n = max(len(rows), 1)
    up = [r.get("bytes_up", 0) for r in rows]
    down = [r.get("bytes_down", 0) for r in rows]
    out["_mb_up"] = sum(up) / n / 1e6
    out["_mb_down"] = sum(down) / n / 1e6
    out["_mb_round"] = out["_mb_up"] + out["_mb_down"]
    out["_mb_total"] = (sum(up) + sum(down)) / 1e6
    out["_mb_first_up"] = up[0] / 1e6 if up else 0.0
    out["_mb_later_up"] = float(np.mean(up[1:])) / 1e6 if len(up) > 1 else float("nan")
    bpe = [r["bytes_per_epoch"] for r in rows if "bytes_per_epoch" in r]
    out["_mb_epoch"] = float(np.mean(bpe)) / 1e6 if bpe else None
    out["_msgs"] = float(np.mean([r["messages"] for r in rows if "messages" in r])) if bpe else None
    out["_wall"] = sum(r.get("wall_time_s", 0.0) for r in rows)
    out["_nonfinite"] = [k for k in ("uar", "accuracy", "accuracy_top5", "test_loss") if k in out
                         and not _finite(out[k])] + (["train_loss"] if any(
                             "train_loss" in r and not _finite(r["train_loss"]) for r in rows) else [])
    return out


def _vals(raw: Path, names: list[str], key: str) -> list[float]:
    out = []
    for n in names:
        r = _final(raw, n)
        if r is not None and _finite(r.get(key)):
            out.append(float(r[key]))
    return out


def _pct(key: str) -> bool:
    return not key.startswith("_")


def _ms(vals: list[float], n_expected: int, key: str = "uar", digits: int = 1) -> str:
    if not vals:
        return "—"
    f = 100.0 if _pct(key) else 1.0
    v = [x * f for x in vals]
    txt = f"{np.mean(v):.{digits}f} ± {np.std(v):.{digits}f}" if len(v) > 1 else f"{v[0]:.{digits}f}"
    return txt + ("" if len(v) == n_expected else f" ({len(v)}/{n_expected})")


def _verdict(a: list[float], b: list[float]) -> tuple[float, float, str]:
    """A claim 'a > b' on fractions, in points."""
    return verdict(a, b, scale=100.0)


def _count(verdicts: list[str], what: str) -> str:
    held = sum(v.startswith("holds") for v in verdicts)
    if any(v.endswith("(1 seed)") for v in verdicts):
        return f"{held} of {len(verdicts)} {what} claims hold (one seed: no spread to judge them by)."
    beyond = sum(v.startswith("holds, beyond") for v in verdicts)
    rev = sum(v.startswith("**reversed**, beyond") for v in verdicts)
    return (f"{held} of {len(verdicts)} {what} claims hold in the mean; {beyond} beyond the seed spread, "
            f"{rev} reversed beyond it, the rest within it.")


def _mstr(raw, names, key, n) -> str:
    return _ms(_vals(raw, names, key), n, key)


# ----------------------------------------------------------------------------- report sections


def fig_section(s, raw) -> tuple[list[str], list[str]]:
    """Fig. 2 / 4 tables per setting and global model; claim checks; summary lines."""
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
                ep = _ms(_vals(raw, names, "_mb_epoch"), n, "_", 2) if m in SPLIT else "—"
                msgs = _ms(_vals(raw, names, "_msgs"), n, "_", 0) if m in SPLIT else "—"
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
            "labels included) once: " + "; ".join(pooled_upload(setting) for setting in s["settings"]) + ".", ""]
    return out, summary


def num_clients(setting: str, s: dict) -> int:
    from mmfl.config import resolve
    from mmfl.data.federation import build_federation

    return build_federation(resolve(base_raw(setting, s))).num_clients


def pooled_upload(setting: str) -> str:
    """Size of the raw training data a centralized run would collect (float32 features, int64 labels)."""
    from mmfl.config import load_raw, resolve
    from mmfl.data import DATASETS

    cfg = resolve(load_raw(ROOT / SETTINGS[setting]))
    b = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    share, priv = modalities_of(setting)
    n = len(b.train)
    size = {m: b.train.features[m][0].numel() * 4 * n for m in (share, priv)}
    lab = 8 * n
    return (f"{setting} {(size[priv] + lab) / 1e6:.1f} MB uni-modal ({priv} + labels), "
            f"{(size[priv] + size[share] + lab) / 1e6:.1f} MB multimodal")


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
            for i, m in enumerate(T2_METHODS):
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
    if "dir" not in s["groups"] or "digits" not in s["settings"]:
        return [], []
    n, setting = len(s["seeds"]), "digits"
    d = DIR_PARTITION
    out = [f"Digits with a Dirichlet({d['beta']:g}) label split over {d['num_clients']} clients, {DIR_PER_ROUND} per "
           "round (same data, model and rounds as the speaker split; the speaker split's rows are the Fig. 2 "
           f"runs). %, mean ± std over seeds {s['seeds']}.", "",
           "| global model | split | method | **UAR** | top-1 | top-5 |", "|---|---|---|---|---|---|"]
    lines, summary, verdicts = ["| claim (UAR) | Δ (points) | spread | here |", "|---|---|---|---|"], [], []
    for variant in VARIANTS:
        for split, kw in (("speaker (6)", {}), (f"Dirichlet ({d['num_clients']})", {"dirichlet": True})):
            vals = {}
            for m in DIR_METHODS:
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
            for m in (["partialfl", "pfl_fedavg"] if q in (0.0, 1.0) else ["partialfl"]):
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
        share, priv = modalities_of(setting)
        part = cfg.partition
        pdesc = part.name + (f", beta {part.params.beta}" if hasattr(part.params, "beta") else "")
        k = num_clients(setting, s)
        mv = cfg.model.values
        a = cfg.algorithm.params
        dp = ", ".join(f"{kk}={v}" for kk, v in vars(cfg.data.params).items()
                       if kk in ("num_train", "num_test", "label", "public_fraction"))
        out.append(f"- **{setting}** (`{SETTINGS[setting]}`): data `{cfg.data.name}` ({dp}); "
                   f"private `{priv}`, shareable `{share}`; {k} clients ({pdesc}), {cfg.run.clients_per_round} per "
                   f"round; {cfg.run.rounds} rounds; model multimodal feat_dim {mv.get('feat_dim')}, "
                   + ", ".join(f"{kk} {mv[kk]}" for kk in ("cnn_channels", "mlp_hidden") if kk in mv)
                   + f", fusion {mv.get('fusion')}; {cfg.train.optimizer} lr {cfg.train.lr}, batch "
                   f"{cfg.train.batch_size}, {cfg.train.local_epochs} local epoch; PartialFL beta {a.beta}, "
                   f"tau {a.tau}, server lr {a.server_lr}; FedProx mu 0.01.")
    return out


def write_report(s, raw: Path, path: Path, quick: bool) -> None:
    planned = plan(s)
    finished = [n for n, r in planned if _done(raw, n, r)]
    failed = sorted((p.parent.name, p.read_text().strip()) for p in raw.glob("*/failed.txt")
                    if p.parent.name in {n for n, _ in planned})
    nonfinite = []
    run_s = 0.0
    for n in finished:
        r = _final(raw, n) or {}
        run_s += r.get("_wall", 0.0)
        if r.get("_nonfinite"):
            nonfinite.append((n, r["_nonfinite"]))
    inv = raw / "last_invocation.json"
    last = json.loads(inv.read_text()) if inv.exists() else None
    cmd = ".venv/bin/python benchmarks/partialfl/run.py" + (" --quick" if quick else "")
    out = [
        "# PartialFL benchmark (paper 003: Fig. 2 / Fig. 4, Tables 2 and 3)"
        + (" — QUICK smoke run, not results" if quick else ""), "",
        f"Regenerate: `{cmd}` (finished runs in `{os.path.relpath(raw, ROOT)}/` are reused; `--tables-only` "
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
    path.write_text("\n".join(out) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke version: 1 seed, 3 rounds (writes partialfl-quick.md)")
    ap.add_argument("--tables-only", action="store_true", help="only rebuild the report from finished runs")
    ap.add_argument("--group", action="append", choices=["fig", "t2", "t3"], help="run only these groups")
    ap.add_argument("--setting", action="append", choices=list(SETTINGS), help="run only these settings")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs still to do and exit")
    ap.add_argument("--raw-dir", type=Path, default=None,
                    help="folder of the run folders (default benchmarks/results/raw/partialfl[-quick])")
    args = ap.parse_args(argv)
    s = copy.deepcopy(QUICK if args.quick else FULL)
    if args.seeds:
        s["seeds"] = args.seeds
    run_s = copy.deepcopy(s)
    if args.group:
        run_s["groups"] = args.group
    if args.setting:
        run_s["settings"] = args.setting
    raw = (args.raw_dir or ROOT / "benchmarks" / "results" / "raw" / ("partialfl-quick" if args.quick else "partialfl"))
    raw = raw.resolve()
    raw.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        todo = [n for n, r in plan(run_s) if not _done(raw, n, r)]
        print("\n".join(todo) + f"\n{len(todo)} runs to do")
        return 0
    if not args.tables_only:
        execute(run_s, raw, args.workers)
    if args.raw_dir:  # a test location: the report stays with its runs
        md = raw / ("partialfl-quick.md" if args.quick else "partialfl.md")
    else:
        md = ROOT / "benchmarks" / "results" / ("partialfl-quick.md" if args.quick else "partialfl.md")
    write_report(s, raw, md, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
