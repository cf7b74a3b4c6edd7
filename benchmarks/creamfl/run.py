"""CreamFL paper benchmark (Tables 1, 2 and 3, Figure 4) on two small image-pair settings,
scaled to about 1.5 hours on 2 idle CPU cores.

    .venv/bin/python benchmarks/creamfl/run.py               # everything -> benchmarks/results/creamfl.md
    .venv/bin/python benchmarks/creamfl/run.py --quick       # a few-minute smoke version
    .venv/bin/python benchmarks/creamfl/run.py --tables-only # rebuild the report from finished runs

Settings (the configs as they are, except ``threads = 1``, the run's ``seed`` and ``rounds``:
16 here, 2 in ``--quick``; the configs have 8):

- ``emoji``: ``mmfl/configs/creamfl.toml`` (public emoji image-text pairs; image-text
  clients on private emoji pairs; Fashion-MNIST image clients; BBC News text clients;
  frozen MobileNetV2 / MiniLM features);
- ``mfeat``: ``mmfl/configs/creamfl_mfeat.toml`` (public mfeat digit pairs, 16x15 image +
  Fourier/Zernike features; image-features clients on private mfeat pairs; image-only
  clients on MNIST resampled to mfeat's 16x15 format).

Groups:

- ``t1``: Table 1 analog, the 9 methods, seeds 0-4, both settings, and two reference rows:
  the server trained on the public pairs alone (``reamfl_mean`` with ``algorithm.kd_weight=0``)
  and CreamFL with one Adam for both server phases (``algorithm.server_optimizer="shared"``);
- ``t3``: Table 3 ablation (GCA, GCA + inter, GCA + intra; the other rows are Table 1 runs);
- ``fig4``: Figure 4 analog, seeds 0-1 (means only; no ordering is claimed from it): creamfl and reamfl_iot with 1/4, 1/2 and all of the
  public set and d = model.feat_dim in {64, 128, 256}; creamfl_fedavg / creamfl_fediot
  with three server-model sizes (every client with the server's architecture);
- ``t2``: Table 2 analog (VQA), after the runs: every Table 1 run of the emoji setting gets
  ``mmfl vqa RUN --emoji`` (``mmfl.vqa_eval.vqa_of_run``; writes ``RUN/vqa.json``).

A run's folder name is derived from its setting, method, the overrides that change the
config and its seed, so the same config is the same folder wherever it is used (Table 3's
reamFL rows and the full CreamFL are Table 1's runs). Runs go to
``benchmarks/results/raw/creamfl/<run>/``; a finished run (summary.json exists) is not
run again, so an interrupted benchmark continues where it stopped (a failed run, with its
failed.txt, is tried again). ``--workers`` worker processes with one torch thread each.

Cost: 198 runs (emoji 10-50 s and mfeat 25-90 s per run at 16 rounds on an idle core;
FedAvg/FedIoT and CreamFL are the slow ones), about 1.5 hours with 2 workers on 2 idle cores,
plus Table 2's 60 VQA evaluations (about 16 s of CPU each). The issue-13 regeneration took
about 4 hours wall on a 2-core machine shared with the FedCMI and MOON benchmarks (389.8 min
of summed, contended run time). ``--quick``: 22 runs of 2 rounds, about 1.5 minutes.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import numpy as np

from mmfl.sweep import machine, paired_verdict, run_missing

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SETTINGS = {"emoji": "mmfl/configs/creamfl.toml", "mfeat": "mmfl/configs/creamfl_mfeat.toml"}
SETTING_TITLE = {"emoji": "emoji image-text (public emoji pairs; Fashion-MNIST image / BBC News text clients)",
                 "mfeat": "mfeat digits image-features (public mfeat pairs; MNIST-as-16x15 image clients)"}
# Table 1 order of the paper: homogeneous (weight sharing), then heterogeneous
METHODS = ["creamfl_fedavg", "creamfl_fediot", "fedmd", "fedet", "fedgems", "reamfl_mean", "reamfl_avg",
           "reamfl_iot", "creamfl"]
LABEL = {"creamfl_fedavg": "FedAvg", "creamfl_fediot": "FedIoT", "fedmd": "FedMD", "fedet": "FedET",
         "fedgems": "FedGEMS", "reamfl_mean": "reamFL+Mean", "reamfl_avg": "reamFL+Avg",
         "reamfl_iot": "reamFL+IoT", "creamfl": "CreamFL"}
WEIGHT_SHARING = ("creamfl_fedavg", "creamfl_fediot")
# Table 3 rows: (label, method, overrides); "creamfl" with no overrides is the full method
ABLATION = [
    ("reamFL+Mean", "reamfl_mean", {}),
    ("reamFL+Avg", "reamfl_avg", {}),
    ("reamFL+IoT", "reamfl_iot", {}),
    ("reamFL+GCA", "creamfl", {"algorithm.inter": False, "algorithm.intra": False}),
    ("reamFL+GCA + LCR.inter", "creamfl", {"algorithm.intra": False}),
    ("reamFL+GCA + LCR.intra", "creamfl", {"algorithm.inter": False}),
    ("CreamFL (GCA + LCR)", "creamfl", {}),
]
# Reference row of Table 1: the server trained on the public pairs alone (no distillation, so
# nothing of the clients reaches it; its trajectory is the same for every representation method)
REFERENCE = ("reamfl_mean", {"algorithm.kd_weight": 0.0})
# Second reference: CreamFL with the authors' one Adam for both server phases (the defect this
# benchmark's earlier version measured: the public epoch's momentum overshoots in distillation)
SHARED_ADAM = ("creamfl", {"algorithm.server_optimizer": "shared"})
# Third: the same with a distillation weight of 1e-9: the distillation phase still takes its
# optimizer steps, but along the public epoch's leftover momentum only (no client knowledge)
SHARED_NO_KD = ("creamfl", {"algorithm.server_optimizer": "shared", "algorithm.kd_weight": 1e-9})
REFERENCES = [("server alone (public pairs only)", REFERENCE),
              ("CreamFL, one Adam for both server phases (authors' code)", SHARED_ADAM),
              ("the same, distillation weight 1e-9 (the leftover momentum alone)", SHARED_NO_KD)]
RKEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "r1_sum"]
# Figure 4: representation sizes d, public shares, server-model sizes of the weight-sharing runs
FIG4_DIMS = [64, 128, 256]
FIG4_PUBLIC = [0.25, 0.5, 1.0]
FIG4_SIZES = {  # the last one is the config's [model] (the Table 1 run)
    "emoji": [{"model.mlp_hidden": [256]}, {"model.mlp_hidden": [512, 512]}, {"model.mlp_hidden": [1024, 1024]}],
    "mfeat": [{"model.cnn_channels": [16, 32], "model.mlp_hidden": [128]},
              {"model.cnn_channels": [24, 48], "model.mlp_hidden": [192]},
              {"model.cnn_channels": [32, 64], "model.mlp_hidden": [256, 256]}],
}

FULL = dict(seeds=[0, 1, 2, 3, 4], fig4_seeds=[0, 1], rounds=16, settings=list(SETTINGS),
            groups=["t1", "t3", "fig4", "t2"],
            methods=METHODS)
QUICK = dict(seeds=[0], fig4_seeds=[0], rounds=2, settings=list(SETTINGS), groups=["t1", "t3", "fig4", "t2"],
             methods=["creamfl_fedavg", "fedgems", "reamfl_mean", "reamfl_iot", "creamfl"], quick=True)

# CreamFL paper, Table 1 (MS-COCO 1K test images) and Table 3 (R@1 sum)
PAPER_T1 = {"creamfl_fedavg": (45.23, 76.74, 85.59, 34.69, 71.68, 85.40, 114.03),
            "creamfl_fediot": (43.31, 75.62, 86.26, 33.94, 70.09, 84.56, 111.19),
            "fedmd": (48.40, 80.24, 89.64, 38.23, 74.44, 86.68, 128.33),
            "fedet": (48.76, 80.39, 89.73, 38.39, 74.68, 86.76, 129.11),
            "fedgems": (48.70, 80.48, 89.62, 38.71, 74.75, 87.01, 129.70),
            "reamfl_avg": (48.85, 80.55, 89.93, 38.13, 74.89, 86.79, 130.02),
            "reamfl_iot": (49.13, 80.61, 89.69, 38.45, 74.83, 86.74, 130.41),
            "creamfl": (49.66, 80.66, 90.13, 38.94, 75.02, 87.14, 132.88)}
PAPER_T3 = [127.65, 130.02, 130.41, 130.82, 131.41, 131.02, 132.88]  # in ABLATION's order


# ----------------------------------------------------------------------------- plan


def base_raw(setting: str, s: dict) -> dict:
    from mmfl.config import load_raw

    raw = load_raw(ROOT / SETTINGS[setting])
    raw["threads"] = 1
    if s.get("rounds"):
        raw["rounds"] = s["rounds"]
    return raw


def _get(raw: dict, key: str, default=None):
    node = raw
    for k in key.split("."):
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return node


def _set(raw: dict, key: str, value) -> None:
    keys = key.split(".")
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def _tag(key: str, value) -> str:
    v = value
    if isinstance(v, bool):
        v = str(v).lower()
    elif isinstance(v, list):
        v = "x".join(str(x) for x in v)
    return f"{key.split('.')[-1]}={v}"


def make_run(setting: str, method: str, seed: int, over: dict, s: dict) -> tuple[str, dict, dict]:
    """(run name, raw config, the overrides that changed it). Overrides equal to the
    config's value (or the method's default) are dropped, so equal configs share a name."""
    from mmfl.algorithms import ALGORITHMS

    raw = base_raw(setting, s)
    _set(raw, "algorithm.name", method)
    raw["seed"] = seed
    if method in WEIGHT_SHARING:  # every client has the server's architecture; the server does not train
        raw.pop("client_models", None)
        import dataclasses

        known = {f.name for f in dataclasses.fields(ALGORITHMS.get(method).params)}
        raw["algorithm"] = {k: v for k, v in raw["algorithm"].items() if k == "name" or k in known}
    defaults = ALGORITHMS.params(method, {})
    kept = {}
    for key, value in over.items():
        if key.startswith("algorithm."):
            cur = _get(raw, key, getattr(defaults, key.split(".", 1)[1], None))
        else:
            cur = _get(raw, key)
        if cur == value:
            continue
        _set(raw, key, value)
        kept[key] = value
    name = "-".join([setting, method, *[_tag(k, v) for k, v in kept.items()], f"s{seed}"])
    raw["name"] = name
    return name, raw, kept


def public_size(setting: str, s: dict) -> int:
    """|P| of a setting's public set (loads the data set; cached after the first time)."""
    from mmfl.config import resolve
    from mmfl.data import DATASETS

    cfg = resolve(base_raw(setting, s))
    bundle = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    return len(bundle.public) if bundle.public is not None else 0


def fig4_points(setting: str, s: dict) -> list[tuple[str, str, dict]]:
    """(series, point label, method, overrides) of Figure 4, in plotting order."""
    pts = []
    n = public_size(setting, s)
    for method in ("creamfl", "reamfl_iot"):
        for frac in FIG4_PUBLIC:
            size = 0 if frac >= 1.0 else max(2, int(round(frac * n)))
            pts.append((f"{LABEL[method]} (vary num)", f"num={size or n}", method, {"algorithm.public_size": size}))
        for d in FIG4_DIMS:
            pts.append((f"{LABEL[method]} (vary d)", f"d={d}", method, {"model.feat_dim": d}))
    for method in WEIGHT_SHARING:
        for over in FIG4_SIZES[setting]:
            label = ",".join(_tag(k, v) for k, v in over.items())
            pts.append((f"{LABEL[method]} (vary server size)", label, method, over))
    return pts


def plan(s: dict) -> list[tuple[str, dict]]:
    """(run name, raw config) of every run, deduplicated: Tables 1 and 3 of every setting first,
    seed by seed, then Figure 4 (so an interrupted benchmark has whole tables first)."""
    runs: dict[str, dict] = {}
    for setting in s["settings"]:
        if "t1" in s["groups"]:
            for seed in s["seeds"]:
                for m, over in [*[(m, {}) for m in s["methods"]], *[ref for _, ref in REFERENCES]]:
                    name, raw, _ = make_run(setting, m, seed, over, s)
                    runs.setdefault(name, raw)
        if "t3" in s["groups"]:
            rows = ABLATION if not s.get("quick") else [r for r in ABLATION if r[1] in s["methods"]][:4]
            for seed in s["seeds"]:
                for _, m, over in rows:
                    name, raw, _ = make_run(setting, m, seed, over, s)
                    runs.setdefault(name, raw)
    for seed in s["fig4_seeds"] if "fig4" in s["groups"] else []:  # seed by seed: whole figures first
        for setting in s["settings"]:
            pts = fig4_points(setting, s)
            if s.get("quick"):  # one point of each kind: 1/4 of the public set, d = 64, smallest FedAvg
                pts = [p for p in pts if p[2] == "creamfl" and p[1] != f"num={public_size(setting, s)}"
                       and not p[1].startswith("d=")][:1] + [p for p in pts if p[1] == "d=64"][:1] \
                    + [p for p in pts if p[2] == "creamfl_fedavg"][:1]
            for _, _, m, over in pts:
                name, raw, _ = make_run(setting, m, seed, over, s)
                runs.setdefault(name, raw)
    return list(runs.items())


# ----------------------------------------------------------------------------- execution


def execute(s: dict, raw_dir: Path, workers: int) -> int:
    """Run what is not finished yet, then Table 2's VQA evaluations; return how many runs this call ran."""
    n = run_missing("creamfl", plan(s), raw_dir, workers, [base_raw(setting, s) for setting in s["settings"]])
    t2 = t2_runs(s)
    if t2:
        run_missing("creamfl VQA (Table 2)", t2, raw_dir, workers, [], post=vqa_post, reuse_finished=True,
                    done=lambda name, raw: (Path(raw_dir) / name / "vqa.json").exists())
    return n


# Table 2 (VQA): every Table 1 run of the emoji setting (the only one with images and text questions)
VQA_SETTING = "emoji"
PAPER_T2 = {"creamfl_fedavg": 52.54, "creamfl_fediot": 53.06, "fedmd": 57.43, "fedet": 59.90, "fedgems": 60.23,
            "reamfl_avg": 58.64, "reamfl_iot": 59.64, "creamfl": 62.12}
T2_CLAIMS = [("creamfl", "fedgems"), ("creamfl", "reamfl_iot"), ("creamfl", "reamfl_avg"), ("creamfl", "fedet"),
             ("creamfl", "fedmd"), ("creamfl", "creamfl_fediot"), ("creamfl", "creamfl_fedavg"),
             ("fedgems", "fedmd"), ("fedmd", "creamfl_fediot"), ("creamfl_fediot", "creamfl_fedavg")]


def t2_runs(s: dict) -> list[tuple[str, dict]]:
    if "t2" not in s["groups"] or VQA_SETTING not in s["settings"]:
        return []
    out = []
    for seed in s["seeds"]:
        for m, over in [*[(m, {}) for m in s["methods"]], *[ref for _, ref in REFERENCES]]:
            name, raw, _ = make_run(VQA_SETTING, m, seed, over, s)
            out.append((name, raw))
    return out


def vqa_post(raw: dict, cfg, run_dir: Path, exp) -> None:
    """Table 2: fine-tune a VQA head on the run's final server model (frozen encoders, the defaults
    of ``mmfl vqa``) on the emoji VQA set of its emoji_pairs split; writes ``run_dir/vqa.json``."""
    from mmfl.vqa_eval import vqa_of_run

    vqa_of_run(run_dir, emoji=True)


# ----------------------------------------------------------------------------- report


def _final(raw: Path, name: str) -> dict | None:
    """The last evaluated row of a finished run, with its mean bytes per round added."""
    from mmfl.report import load_metrics

    if not (raw / name / "summary.json").exists():
        return None
    rows = load_metrics(raw / name)
    evals = [r for r in rows if "r1_sum" in r]
    if not evals:
        return None
    out = dict(evals[-1])
    n = max(len(rows), 1)
    out["_mb_up"] = sum(r.get("bytes_up", 0) for r in rows) / n / 1e6
    out["_mb_down"] = sum(r.get("bytes_down", 0) for r in rows) / n / 1e6
    out["_mb_round"] = out["_mb_up"] + out["_mb_down"]
    out["_mb_total"] = sum(r.get("bytes_up", 0) + r.get("bytes_down", 0) for r in rows) / 1e6
    out["_wall"] = sum(r.get("wall_time_s", 0.0) for r in rows)
    return out


def _vals(raw: Path, names: list[str], key: str = "r1_sum") -> list[float]:
    out = []
    for n in names:
        r = _final(raw, n)
        if r is not None and r.get(key) is not None:
            out.append(float(r[key]))
    return out


def _ms(vals: list[float], n_expected: int, digits: int = 1) -> str:
    if not vals:
        return "—"
    txt = f"{np.mean(vals):.{digits}f} ± {np.std(vals):.{digits}f}" if len(vals) > 1 else f"{vals[0]:.{digits}f}"
    return txt + ("" if len(vals) == n_expected else f" ({len(vals)}/{n_expected})")


def t1_names(setting: str, method: str, s: dict, over: dict | None = None) -> list[str]:
    return [make_run(setting, method, seed, over or {}, s)[0] for seed in s["seeds"]]


def table1(s, raw) -> list[str]:
    seeds = s["seeds"]
    lines = []
    for setting in s["settings"]:
        lines += [f"### {setting}: {SETTING_TITLE[setting]}", "",
                  f"Final round, server model, test set; mean ± std over seeds {seeds}. MB per round = "
                  "engine payload bytes (10^6) per round, mean over rounds, all clients of the round.", "",
                  "| type | method | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | **R@1 sum** "
                  "| MB up / round | MB down / round | paper R@1 sum (COCO 1K) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in s["methods"]:
            names = t1_names(setting, m, s)
            cells = [_ms(_vals(raw, names, k), len(seeds)) for k in RKEYS]
            cells[-1] = f"**{cells[-1]}**"
            up = _vals(raw, names, "_mb_up")
            down = _vals(raw, names, "_mb_down")
            kind = "homogeneous" if m in WEIGHT_SHARING else "heterogeneous"
            paper = f"{PAPER_T1[m][-1]:.2f}" if m in PAPER_T1 else "127.65 (Table 3)"
            lines.append(f"| {kind} | {LABEL[m]} | " + " | ".join(cells)
                         + f" | {_ms(up, len(seeds), 2)} | {_ms(down, len(seeds), 2)} | {paper} |")
        for label, (m, over) in REFERENCES:
            names = t1_names(setting, m, s, over)
            cells = [_ms(_vals(raw, names, k), len(seeds)) for k in RKEYS]
            lines.append(f"| reference | {label} | " + " | ".join(cells) + " | — | — | — |")
        lines += ["", "*Server alone*: `reamfl_mean` with `algorithm.kd_weight=0`: the server trains on the public "
                  "pairs exactly as in every representation-exchange method (same seeds, same steps) but distills "
                  "nothing, so no client knowledge reaches it. A method above it gains from the clients; one below "
                  "it is hurt by them. *One Adam for both server phases*: `creamfl` with "
                  "`algorithm.server_optimizer=\"shared\"`, the optimizer of the authors' code and of this "
                  "benchmark's earlier version (see `docs/algorithms/creamfl.md`).", ""]
        lines += teacher_table(s, raw, setting)
    return lines


def teacher_table(s, raw, setting) -> list[str]:
    """How good eq. 7's teacher is: the R@1 sum on the public set of the aggregated client
    representations vs the server's own, final round (keys logged by every CreamFL-family run)."""
    rows = []
    for m in [m for m in s["methods"] if m not in WEIGHT_SHARING]:
        names = t1_names(setting, m, s)
        tgt, own = _vals(raw, names, "target_public_r1_sum"), _vals(raw, names, "server_public_r1_sum")
        cos = [np.mean([v for k, v in r.items() if k.startswith("target_cos/")])
               for r in (_final(raw, n) for n in names) if r is not None and any(k.startswith("target_cos/") for k in r)]
        if tgt and own:
            rows.append(f"| {LABEL[m]} | {_ms(tgt, len(s['seeds']))} | {_ms(own, len(s['seeds']))} "
                        f"| {_ms(cos, len(s['seeds']), 2)} |")
    if not rows:
        return []
    return [f"**The distillation's teacher ({setting})**: R@1 sum on the *public* set, final round, of the "
            "aggregated client representations the server distills toward (eq. 6-7) and of the server's own "
            "representations (before distilling), and their mean cosine; mean ± std over seeds.", "",
            "| method | teacher (aggregated clients) | server's own | cosine teacher-server |", "|---|---|---|---|",
            *rows, ""]


def _means(raw, setting, s, rows: dict[str, tuple[str, dict]]) -> dict[str, list[float]]:
    out = {}
    for key, (m, over) in rows.items():
        v = _vals(raw, t1_names(setting, m, s, over))
        if v:
            out[key] = v
    return out


def _paired(raw, setting, s, a: tuple[str, dict], b: tuple[str, dict], key: str = "r1_sum") -> dict | None:
    """:func:`paired_verdict` of run a vs run b over the seeds both finished."""
    va, vb = [], []
    for seed in s["seeds"]:
        ra = _final(raw, make_run(setting, a[0], seed, a[1], s)[0])
        rb = _final(raw, make_run(setting, b[0], seed, b[1], s)[0])
        if ra is not None and rb is not None and ra.get(key) is not None and rb.get(key) is not None:
            va.append(float(ra[key])), vb.append(float(rb[key]))
    return paired_verdict(va, vb) if va else None


T1_CLAIMS = [  # the paper's Table 1 ordering, as pairwise claims "a > b"
    ("creamfl", "reamfl_iot"), ("creamfl", "reamfl_avg"), ("creamfl", "fedgems"), ("creamfl", "fedet"),
    ("creamfl", "fedmd"), ("reamfl_iot", "fedgems"), ("reamfl_iot", "fedet"), ("reamfl_avg", "fedgems"),
    ("reamfl_avg", "fedet"), ("fedgems", "fedmd"), ("fedet", "fedmd"), ("fedmd", "creamfl_fedavg"),
    ("fedmd", "creamfl_fediot"), ("creamfl", "creamfl_fedavg"), ("creamfl", "creamfl_fediot"),
]
T3_CLAIMS = [  # Table 3, as pairwise claims (indices into ABLATION)
    (6, 4), (6, 5), (4, 3), (5, 3), (3, 2), (3, 1), (3, 0), (2, 0), (1, 0),
]


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


CLAIM_HEAD = ["| claim (paper) | mean Δ R@1 sum (paired) | 95% bootstrap CI | paired t-test p | here |",
              "|---|---|---|---|---|"]


def ordering(s, raw) -> tuple[list[str], list[str]]:
    """Pairwise checks of the paper's orderings (paired over seeds); the lines of the tables and a summary."""
    lines, summary = [], []
    for setting in s["settings"]:
        t1 = _means(raw, setting, s, {m: (m, {}) for m in s["methods"]})
        if t1:
            rank = sorted(t1, key=lambda m: -np.mean(t1[m]))
            summary.append(f"- **{setting}**, Table 1 ranking by mean R@1 sum: "
                           + " > ".join(f"{LABEL[m]} ({np.mean(t1[m]):.1f})" for m in rank) + ".")
            lines += [f"### {setting}: Table 1 ordering (the paper: CreamFL > reamFL+IoT/Avg > FedGEMS/FedET > "
                      "FedMD > FedAvg/FedIoT)", "", *CLAIM_HEAD]
            verdicts: list[dict] = []
            lines += _claim_rows([(f"{LABEL[a]} > {LABEL[b]}", _paired(raw, setting, s, (a, {}), (b, {})))
                                  for a, b in T1_CLAIMS if a in t1 and b in t1], verdicts)
            lines.append("")
            if verdicts:
                summary.append("  " + _count(verdicts, "Table 1"))
            # every method against the server alone: does client knowledge help the server?
            lines += [f"### {setting}: each method against the server alone (does client knowledge help?)", "",
                      "| claim | mean Δ R@1 sum (paired) | 95% bootstrap CI | paired t-test p | here |",
                      "|---|---|---|---|---|"]
            ref_v: list[dict] = []
            lines += _claim_rows([(f"{LABEL[m]} > server alone", _paired(raw, setting, s, (m, {}), REFERENCE))
                                  for m in s["methods"] if m in t1], ref_v)
            shared = _paired(raw, setting, s, ("creamfl", {}), SHARED_ADAM)
            no_kd = _paired(raw, setting, s, SHARED_ADAM, SHARED_NO_KD)
            lines += _claim_rows([("CreamFL > CreamFL with one Adam for both phases", shared),
                                  ("one Adam: CreamFL > the same with distillation weight 1e-9", no_kd)], [])
            lines.append("")
            if ref_v:
                above = sum(v["text"].startswith("holds") for v in ref_v)
                below = sum(v["text"].startswith("**reversed**") for v in ref_v)
                summary.append(f"  Against the server alone: {above} of {len(ref_v)} methods are above it and "
                               f"{below} below it by the paired test, the rest unresolved.")
        if "t3" in s["groups"]:
            t3 = _means(raw, setting, s, {str(i): (m, over) for i, (_, m, over) in enumerate(ABLATION)})
            if t3:
                lines += [f"### {setting}: Table 3 ordering (the paper: full > GCA+inter > GCA+intra > GCA > "
                          "IoT > Avg > Mean)", "", *CLAIM_HEAD]
                verdicts = []
                lines += _claim_rows([(f"{ABLATION[a][0]} > {ABLATION[b][0]}",
                                       _paired(raw, setting, s, ABLATION[a][1:], ABLATION[b][1:]))
                                      for a, b in T3_CLAIMS if str(a) in t3 and str(b) in t3], verdicts)
                lines.append("")
                if verdicts:
                    rank = sorted(t3, key=lambda k: -np.mean(t3[k]))
                    summary.append(f"- **{setting}**, Table 3 ranking by mean R@1 sum: "
                                   + " > ".join(f"{ABLATION[int(k)][0]} ({np.mean(t3[k]):.1f})" for k in rank) + ".")
                    summary.append("  " + _count(verdicts, "Table 3"))
    return lines, summary


def _m(raw, names, key="r1_sum") -> tuple[float, float, int] | None:
    v = _vals(raw, names, key)
    return (float(np.mean(v)), float(np.std(v)), len(v)) if v else None


def _fmt(x: tuple[float, float, int] | None) -> str:
    if x is None:
        return "—"
    return f"{x[0]:.1f} ± {x[1]:.1f}" if x[2] > 1 else f"{x[0]:.1f}"


def findings(s, raw) -> list[str]:
    """Statements read off the numbers (no interpretation): ranks, gaps, bytes, Fig. 4 trends."""
    out = []
    for setting in s["settings"]:
        means = {m: _m(raw, t1_names(setting, m, s)) for m in s["methods"]}
        means = {m: v for m, v in means.items() if v is not None}
        if not means:
            continue
        rank = sorted(means, key=lambda m: -means[m][0])
        lines = [f"**{setting}**"]
        if "creamfl" in means:
            lines.append(f"- CreamFL ranks {rank.index('creamfl') + 1} of {len(rank)} in Table 1 "
                         f"(R@1 sum {_fmt(means['creamfl'])}); first: {LABEL[rank[0]]} ({_fmt(means[rank[0]])}); "
                         f"last: {LABEL[rank[-1]]} ({_fmt(means[rank[-1]])}).")
            het = [m for m in rank if m not in WEIGHT_SHARING]
            lines.append(f"- Among the representation-exchange methods CreamFL ranks {het.index('creamfl') + 1} "
                         f"of {len(het)}; their means span {means[het[-1]][0]:.1f} to {means[het[0]][0]:.1f}.")
            ref = _m(raw, t1_names(setting, REFERENCE[0], s, REFERENCE[1]))
            if ref is not None:
                above = [m for m in rank if means[m][0] > ref[0]]
                lines.append(f"- The server alone (public pairs only) reaches {_fmt(ref)}; {len(above)} of "
                             f"{len(rank)} methods are above it in the mean"
                             + (f" ({', '.join(LABEL[m] for m in above)})" if above else "")
                             + " (the paired tests are in the section above).")
            sh = _m(raw, t1_names(setting, SHARED_ADAM[0], s, SHARED_ADAM[1]))
            if sh is not None:
                lines.append(f"- CreamFL with one Adam for both server phases (the authors' optimizer): {_fmt(sh)} "
                             f"against {_fmt(means['creamfl'])} with the phases' momentum restarted (the default).")
        mb = {m: _m(raw, t1_names(setting, m, s), "_mb_round") for m in ("creamfl", "creamfl_fedavg", "reamfl_iot")}
        if mb.get("creamfl") and mb.get("creamfl_fedavg"):
            lines.append(f"- Bytes per round (up + down): CreamFL {mb['creamfl'][0]:.2f} MB, FedAvg/FedIoT "
                         f"{mb['creamfl_fedavg'][0]:.2f} MB ({mb['creamfl_fedavg'][0] / mb['creamfl'][0]:.1f}x CreamFL)"
                         + (f", reamFL+IoT {mb['reamfl_iot'][0]:.2f} MB (it sends no global representations down)"
                            if mb.get("reamfl_iot") else "") + ".")
        if "fig4" in s["groups"]:
            for ser, p in fig4_series(s, raw, setting).items():
                if len(p) > 1:
                    lines.append(f"- Fig. 4, {ser}: "
                                 + ", ".join(f"{lab}: {y:.1f} ± {sd:.1f} ({x:.2f} MB/round)"
                                             for lab, x, y, sd, _, _ in p) + ".")
        out += lines + [""]
    return out


def _vqa(raw: Path, name: str) -> float | None:
    f = raw / name / "vqa.json"
    return float(json.loads(f.read_text())["accuracy"]) if f.exists() else None


def table2(s, raw) -> list[str]:
    """Table 2 analog: VQA accuracy of each method's final server model (emoji VQA set), and the
    paper's ordering as paired claims."""
    if VQA_SETTING not in s["settings"]:
        return []
    seeds = s["seeds"]
    by = {}
    for m, over in [*[(m, {}) for m in s["methods"]], *[ref for _, ref in REFERENCES]]:
        by[(m, tuple(over.items()))] = {seed: v for seed in seeds
                                        if (v := _vqa(raw, make_run(VQA_SETTING, m, seed, over, s)[0])) is not None}
    lines = [f"VQA accuracy (%, soft score min(#humans / 3, 1)) of the final server model on the emoji VQA set "
             f"(`mmfl vqa RUN --emoji`, frozen server encoders, a fused-product MLP head fine-tuned on the train "
             f"split's questions; see `docs/vqa.md`: the questions are templated over real emoji images, so the "
             f"numbers are not comparable with VQA v2's); mean ± std over seeds {seeds}.", "",
             "| method | VQA accuracy | paper (VQA v2) |", "|---|---|---|"]
    for m in s["methods"]:
        v = list(by[(m, ())].values())
        lines.append(f"| {LABEL[m]} | {_ms(v, len(seeds))} | {PAPER_T2.get(m, '—')} |")
    for label, (m, over) in REFERENCES:
        lines.append(f"| reference: {label} | {_ms(list(by[(m, tuple(over.items()))].values()), len(seeds))} | — |")
    lines += ["", f"### {VQA_SETTING}: Table 2 ordering (the paper: CreamFL > FedGEMS > reamFL+IoT > FedET > "
              "reamFL+Avg > FedMD > FedIoT > FedAvg)", "", CLAIM_HEAD[0].replace("R@1 sum", "VQA accuracy"), CLAIM_HEAD[1]]

    def pv(a, b):
        va, vb = by[a], by[b]
        common = [x for x in seeds if x in va and x in vb]
        return paired_verdict([va[x] for x in common], [vb[x] for x in common]) if common else None

    verdicts: list[dict] = []
    lines += _claim_rows([(f"{LABEL[a]} > {LABEL[b]}", pv((a, ()), (b, ()))) for a, b in T2_CLAIMS
                          if a in s["methods"] and b in s["methods"]], verdicts)
    ref = (REFERENCE[0], tuple(REFERENCE[1].items()))
    lines += _claim_rows([(f"{LABEL[m]} > server alone", pv((m, ()), ref)) for m in s["methods"]], [])
    lines.append("")
    if verdicts:
        lines.append(_count(verdicts, "Table 2"))
        lines.append("")
    return lines


def table3(s, raw) -> list[str]:
    seeds = s["seeds"]
    lines = []
    for setting in s["settings"]:
        lines += [f"### {setting}: R@1 sum (and rsum, the six recalls), mean ± std over seeds {seeds}", "",
                  "| components | run overrides | R@1 sum | rsum | paper R@1 sum |", "|---|---|---|---|---|"]
        for (label, m, over), paper in zip(ABLATION, PAPER_T3):
            names = t1_names(setting, m, s, over)
            desc = f"`{m}`" + ("".join(f" `{k}={str(v).lower()}`" for k, v in over.items()) if over else "")
            lines.append(f"| {label} | {desc} | {_ms(_vals(raw, names), len(seeds))} "
                         f"| {_ms(_vals(raw, names, 'rsum'), len(seeds))} | {paper:.2f} |")
        lines.append("")
    return lines


def fig4_series(s, raw, setting) -> dict[str, list[tuple]]:
    """Figure 4's points over seeds: ``{series: [(label, MB/round, mean R@1 sum, std, total MB, n)]}``."""
    series: dict[str, list[tuple]] = {}
    for ser, label, m, over in fig4_points(setting, s):
        rows = [r for r in (_final(raw, make_run(setting, m, seed, over, s)[0]) for seed in s["fig4_seeds"])
                if r is not None]
        if rows:
            y = [r["r1_sum"] for r in rows]
            series.setdefault(ser, []).append((label, float(np.mean([r["_mb_round"] for r in rows])),
                                               float(np.mean(y)), float(np.std(y)),
                                               float(np.mean([r["_mb_total"] for r in rows])), len(rows)))
    return series


def fig4(s, raw, out_png: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    lines = []
    settings = s["settings"]
    fig, axes = plt.subplots(1, len(settings), figsize=(6.2 * len(settings), 4.4), squeeze=False)
    styles = {"CreamFL (vary num)": ("tab:blue", "-", "o"), "CreamFL (vary d)": ("tab:orange", "-", "s"),
              "reamFL+IoT (vary num)": ("tab:blue", "--", "o"), "reamFL+IoT (vary d)": ("tab:orange", "--", "s"),
              "FedAvg (vary server size)": ("tab:red", ":", "^"), "FedIoT (vary server size)": ("tab:purple", ":", "v")}
    for ax, setting in zip(axes[0], settings):
        lines += [f"### {setting}, mean ± std over seeds {s['fig4_seeds']} (descriptive: no ordering is claimed "
                  "from Figure 4)", "",
                  "| series | point | MB / round (up + down) | total MB | R@1 sum | seeds |",
                  "|---|---|---|---|---|---|"]
        series = fig4_series(s, raw, setting)
        labels: dict[tuple, list[str]] = {}  # one annotation per point (num=all and d=default coincide)
        for ser, pts in series.items():
            for lab, mb, y, sd, total, n in pts:
                lines.append(f"| {ser} | {lab} | {mb:.2f} | {total:.1f} | {y:.1f} ± {sd:.1f} | {n} |")
            color, ls, mk = styles.get(ser, ("k", "-", "o"))
            pts = sorted(pts, key=lambda p: p[4])
            ax.errorbar([p[4] for p in pts], [p[2] for p in pts], yerr=[p[3] for p in pts], color=color,
                        linestyle=ls, marker=mk, label=ser, capsize=2,
                        markerfacecolor="none" if ls == "--" else color)
            for lab, _, y, _, x, _ in pts:
                lab = lab.replace("mlp_hidden=", "h=").replace("cnn_channels=", "c=").replace(",", " ")
                here = labels.setdefault((round(x, 6), round(y, 6)), [])
                if lab not in here:
                    here.append(lab)
        for (x, y), labs in labels.items():
            ax.annotate(" / ".join(labs), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("total bytes up + down over the run (MB, log)")
        ax.set_ylabel("R@1 sum (i2t + t2i, %), mean ± std over seeds")
        ax.set_title(f"{setting}: communication vs performance (Fig. 4 analog)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        if series:
            ax.legend(fontsize=7)
        lines.append("")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return lines


def scale_lines(s, raw) -> list[str]:
    from mmfl.config import resolve

    out = []
    for setting in s["settings"]:
        cfg = resolve(base_raw(setting, s))
        mods = ", ".join(f"{g.modalities or g.clients}: " + ", ".join(
            f"{k}={v}" for k, v in g.model.values.items() if k in ("cnn_channels", "mlp_hidden", "feat_dim"))
            for g in cfg.client_models)
        extra = "; ".join(f"{e.data.name} ({e.partition.name}, {e.partition.params.num_clients} clients"
                          + (f", beta {e.partition.params.beta}" if hasattr(e.partition.params, "beta") else "")
                          + ")" for e in cfg.client_data)
        srv = ", ".join(f"{k}={v}" for k, v in cfg.model.values.items()
                        if k in ("cnn_channels", "mlp_hidden", "feat_dim"))
        out.append(f"- **{setting}** (`{SETTINGS[setting]}`): data `{cfg.data.name}` "
                   f"(|public| = {public_size(setting, s)}), {cfg.partition.params.num_clients} paired clients "
                   f"({cfg.partition.name}); uni-modal clients: {extra}; {cfg.run.rounds} rounds, "
                   f"{cfg.run.clients_per_round} clients per round, {cfg.train.local_epochs} local epochs, "
                   f"{cfg.train.optimizer} lr {cfg.train.lr}, batch {cfg.train.batch_size}. Server [model]: {srv}; "
                   f"[[client_models]]: {mods or 'none'} (FedAvg/FedIoT: none, every client has the server's model).")
    return out


def write_report(s, raw: Path, path: Path, png: Path, quick: bool) -> None:
    failed = sorted((p.parent.name, p.read_text().strip()) for p in raw.glob("*/failed.txt"))
    planned = {n for n, _ in plan(s)}
    finished = [n for n in planned if (raw / n / "summary.json").exists()]
    run_s = sum((_final(raw, n) or {}).get("_wall", 0.0) for n in finished)
    inv = raw / "last_invocation.json"
    last = json.loads(inv.read_text()) if inv.exists() else None
    cmd = ".venv/bin/python benchmarks/creamfl/run.py" + (" --quick" if quick else "")
    out = [
        "# CreamFL benchmark (Tables 1, 2 and 3, Figure 4)" + (" — QUICK smoke run, not results" if quick else ""), "",
        f"Regenerate: `{cmd}` (finished runs in `{os.path.relpath(raw, ROOT)}/` are reused; "
        "`--tables-only` rebuilds this file; `--workers N` sets the worker processes).", "",
        "## Scale", "",
        *scale_lines(s, raw),
        f"- Rounds: {s['rounds'] or 'as in the configs'} (the configs have 8; the runs are otherwise the configs "
        "as they are, with `threads = 1` and the seed set).",
        "- Methods: every method with its registered defaults (`mmfl list`); nothing was tuned on these "
        "results. FedAvg / FedIoT (`creamfl_fedavg` / `creamfl_fediot`) give every client the server's "
        "architecture (the run drops `[[client_models]]`) and the public pairs to the image-text clients.",
        f"- Seeds {s['seeds']} for every table, {s['fig4_seeds']} for Figure 4 (run seed: model init, client sampling, partition; "
        "the data sets' own splits are fixed); mean ± std (population std, ddof 0) over seeds.",
        "- Metrics: the server model's final-round Recall@K (%) on the setting's test pairs (a few hundred "
        "pairs, so a single R@1 step is a fraction of a point); R@1 sum = i2t R@1 + t2i R@1, rsum = all six.",
        f"- Machine: {machine()}.",
        f"- Runs: {len(finished)} of {len(planned)} planned finished; summed run time {run_s / 60:.1f} min of "
        "single-thread compute (the rounds' wall times)"
        + (f"; the last invocation ran {last['runs']} runs in {last['wall_s'] / 60:.1f} min wall with "
           f"{last['workers']} workers (load average at its start: "
           f"{' '.join(f'{x:.1f}' for x in last['load_average_at_start'] or [])})" if last else "") + ".",
        "",
    ]
    if failed:
        out += [f"**Failed runs** ({len(failed)}):", ""] + [f"- `{n}`: {e}" for n, e in failed] + [""]
    order_lines, summary = ordering(s, raw)
    if "t1" in s["groups"]:
        out += ["## Table 1 analog: cross-modal retrieval of the server model", ""] + table1(s, raw)
    if "t2" in s["groups"]:
        out += ["## Table 2 analog: visual question answering", ""] + table2(s, raw)
    if "t3" in s["groups"]:
        out += ["## Table 3 analog: ablation", ""] + table3(s, raw)
    if "fig4" in s["groups"]:
        rel = os.path.relpath(png, path.parent)
        out += ["## Figure 4 analog: communication vs performance", "",
                "x = total payload bytes up + down over the run (the paper plots the same per round; every run "
                "has the same number of rounds, so the shape is the same). Blue: public set size varied at the "
                "config's d; orange: d = model.feat_dim varied (the client models inherit it) with all public "
                "pairs; solid CreamFL, dashed reamFL+IoT; dotted: FedAvg / FedIoT at three server-model sizes.",
                "", f"![fig4]({rel})", ""] + fig4(s, raw, png)
    out += ["## Does the paper's ordering hold?", "",
            "Computed from the runs above, paired by seed (the same seed gives both methods the same partition, "
            "initialisation and client sampling): a claim 'a > b' *holds* when the 95% percentile-bootstrap "
            "confidence interval of the mean per-seed difference lies above 0 and a paired t-test gives "
            "p < 0.05, is **reversed** when both say the opposite, and is *unresolved* otherwise "
            "(`mmfl.sweep.paired_verdict`).", ""] + summary + [""] + order_lines
    out += ["## Findings (generated from the numbers above)", ""] + findings(s, raw)
    analysis = HERE / "analysis.md"
    if analysis.exists() and not quick:
        out += ["## Reading the results", "", analysis.read_text().strip(), ""]
    path.write_text("\n".join(out) + "\n")
    print(f"wrote {path} and {png}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke version: 1 seed, 2 rounds, 5 methods (writes creamfl-quick.md)")
    ap.add_argument("--tables-only", action="store_true", help="only rebuild the report from finished runs")
    ap.add_argument("--group", action="append", choices=["t1", "t3", "fig4", "t2"], help="run only these groups")
    ap.add_argument("--setting", action="append", choices=list(SETTINGS), help="run only these settings")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (one torch thread each)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds of Tables 1-3 (default 0 1 2 3 4)")
    ap.add_argument("--fig4-seeds", type=int, nargs="+", default=None, help="seeds of Figure 4 (default 0 1)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs still to do and exit")
    ap.add_argument("--raw-dir", type=Path, default=None,
                    help="folder of the run folders (default benchmarks/results/raw/creamfl[-quick])")
    args = ap.parse_args(argv)
    s = copy.deepcopy(QUICK if args.quick else FULL)
    missing = [k for k in s["settings"] if not (ROOT / SETTINGS[k]).exists()]
    if missing:
        print(f"note: no config for {missing} ({[SETTINGS[k] for k in missing]}); left out", flush=True)
        s["settings"] = [k for k in s["settings"] if k not in missing]
    if args.seeds:
        s["seeds"] = args.seeds
    if args.fig4_seeds:
        s["fig4_seeds"] = args.fig4_seeds
    run_s = copy.deepcopy(s)
    if args.group:
        run_s["groups"] = args.group
    if args.setting:
        run_s["settings"] = args.setting
    raw = args.raw_dir or ROOT / "benchmarks" / "results" / "raw" / ("creamfl-quick" if args.quick else "creamfl")
    raw = raw.resolve()
    raw.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        todo = [n for n, _ in plan(run_s) if not (raw / n / "summary.json").exists()]
        print("\n".join(todo) + f"\n{len(todo)} runs to do")
        return 0
    if not args.tables_only:
        execute(run_s, raw, args.workers)
    if args.raw_dir:  # a test location: the report stays with its runs
        md, png = raw / ("creamfl-quick.md" if args.quick else "creamfl.md"), raw / "creamfl_fig4.png"
    elif args.quick:
        md, png = ROOT / "benchmarks" / "results" / "creamfl-quick.md", raw / "creamfl_fig4.png"
    else:
        md, png = ROOT / "benchmarks" / "results" / "creamfl.md", ROOT / "benchmarks" / "results" / "creamfl_fig4.png"
    write_report(s, raw, md, png, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
