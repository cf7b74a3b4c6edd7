"""Wireless personalized-FMML benchmark tables (grid: grid.toml): Tables I-V, Fig. 3, the eta^
check, communication, diagnostics, the paper's orderings, findings. Rows iterate over the
grid's methods; the claims and the paper's numbers are the paper's named choices.

Every method's accuracy is the engine's personalized evaluation: the personalized methods
declare it, the others (mfedavg, mfedprox, local) run with ``personal_eval = true`` (grid.toml)
and report it under ``personal/`` in their metrics rows (:func:`_final` reads it from there).
Post-run (``post``): Xi of every kept round of the Fig. 3 runs (``xi_history.json``)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np

from mmfl.algorithms.fedavg import FedAvgParams
from mmfl.bench import finite, ms, verdict_count
from mmfl.sweep import machine, spread_text, verdict

HERE = Path(__file__).resolve().parent
SETTING_TITLE = {"digits": "audio-visual digits (FSDD audio + MNIST image, class-paired, noisy), 9 devices",
                 "mfeat": "mfeat, three views (pix image, fou, zer), 18 devices"}
PAPER_DATA = {"digits": "CREMA-D", "mfeat": "MOSEI"}
PARTS = ["niid1", "niid2", "niid3"]
PART_LABEL = {"niid1": "non-IID-1", "niid2": "non-IID-2", "niid3": "non-IID-3"}
PERSONAL = "personal/"  # the engine's personalized evaluation of the runs with personal_eval = true
KHATS = {"K/3": 1 / 3, "2K/3": 2 / 3, "K": 1.0}
PAPER_ETA = 0.01

# The paper's numbers (%, and seconds in Tables III and V); columns non-IID-1, 2, 3
PAPER_T12 = {
    "digits": {"mfedavg": (48.90, 52.99, 36.90), "local": (54.93, 53.51, 39.70), "mfedprox": (51.02, 53.08, 36.90),
               "fedfomo": (57.53, 54.03, 43.14), "fedamp": (58.65, 53.90, 41.91),
               "pfedwireless": (65.31, 55.98, 48.11)},
    "mfeat": {"mfedavg": (49.13, 52.46, 43.54), "local": (50.81, 52.72, 43.21), "mfedprox": (49.05, 53.01, 43.27),
              "fedfomo": (50.88, 53.44, 43.81), "fedamp": (50.15, 53.28, 43.65),
              "pfedwireless": (52.88, 54.81, 45.47)},
}
PAPER_T3 = {"ratio": (65.31, 5.30e3), 1e-4: (65.32, 5.47e3), 1e-3: (64.52, 5.39e3), 1e-2: (63.21, 4.68e3)}
PAPER_T4 = {("niid1", "mfedavg"): (48.90, 49.02, 48.83), ("niid1", "fedamp"): (58.65, 58.55, 59.48),
            ("niid1", "pfedwireless"): (65.31, 64.18, 66.89), ("niid2", "mfedavg"): (52.99, 54.86, 54.10),
            ("niid2", "fedamp"): (53.90, 55.53, 55.07), ("niid2", "pfedwireless"): (55.98, 58.56, 59.74),
            ("niid3", "mfedavg"): (36.90, 40.38, 41.05), ("niid3", "fedamp"): (41.91, 40.26, 41.12),
            ("niid3", "pfedwireless"): (48.11, 47.98, 48.13)}
PAPER_T5 = {"mfedavg": (6.50e3, 7.47e3, 7.87e3), "fedfomo": (7.95e3, 1.13e4, 1.46e4),
            "pfedwireless": (5.47e3, 7.10e3, 7.87e3)}


# ----------------------------------------------------------------------------- post-run


def _needs(raw: dict) -> list[str]:
    """The files a finished run of this config must have besides summary.json."""
    return ["xi_history.json"] if raw.get("keep_checkpoints", 1) > 1 else []


def done(d: Path, raw: dict) -> bool:
    return (d / "summary.json").exists() and all((d / f).exists() for f in _needs(raw))


def xi_history(cfg, run_dir: Path) -> dict:
    """xi~ (eq. 4, the row softmax of Xi) of every group after every round, from the kept
    checkpoints, plus what Fig. 3's reading needs (who holds what, which classes)."""
    import torch
    from safetensors import safe_open

    from mmfl.data.federation import build_federation

    fed = build_federation(cfg)
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("round_?????") if (p / "meta.json").is_file())
    rounds, xi = [], {}
    for p in ckpts:
        with safe_open(str(p / "server.safetensors"), framework="pt") as f:
            keys = [k for k in f.keys() if k.startswith("xi/")]
            for k in keys:
                x = torch.softmax(f.get_tensor(k).to(torch.float64), dim=1)
                xi.setdefault(k[len("xi/"):], []).append(x.tolist())
        rounds.append(int(json.loads((p / "meta.json").read_text())["round"]))
    return {"rounds": rounds, "xi_tilde": xi, "num_clients": fed.num_clients,
            "holds": [list(fed.modalities_of(c)) for c in range(fed.num_clients)],
            "classes": [sorted(int(v) for v in np.unique(c.label_array())) for c in fed.clients],
            "eta_hat": cfg.algorithm.params.eta_hat}


def post(raw: dict, cfg, d: Path, exp=None) -> None:
    """The files a run's reading needs beyond its own (:func:`_needs`), from its checkpoints."""
    need = _needs(raw)
    if "xi_history.json" in need and not (d / "xi_history.json").exists():
        hist = xi_history(cfg, d)
        if len(hist["rounds"]) < cfg.run.rounds:
            raise RuntimeError(f"{d.name}: only {len(hist['rounds'])} of {cfg.run.rounds} checkpoints kept")
        (d / "xi_history.json").write_text(json.dumps(hist))
        ckpts = sorted((d / "checkpoints").glob("round_?????"))
        for p in ckpts[:-1]:  # the last one stays (LATEST points to it)
            shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------- readings


def _planned(b, group, method) -> bool:
    return any(b.names(group, method, st) for st in b.grid.settings(group))


def context(b) -> dict:
    """What the sections read off the grid: seeds, settings, partitions, K^ values, alphas,
    etas with planned runs; the t12 methods and their labels; each setting's base config."""
    from mmfl.config import load_raw

    g = b.grid
    t12 = g.settings("t12")
    live = {k: e for k, e in t12.items() if b.names("t12", "pfedwireless", k)}
    s = {"b": b, "seeds": g.seeds, "groups": ["t12", "t3", "t4", "t5", "eta"], "fig3_seed": g.seeds[0],
         "settings": list(dict.fromkeys(e.info["setting"] for e in t12.values())),
         "parts": list(dict.fromkeys(e.info["part"] for e in live.values())),
         "methods": list(b.methods("t12")), "label": {m: e.label for m, e in b.methods("t12").items()},
         "t4_methods": list(b.methods("t4")), "t5_methods": list(b.methods("t5")),
         "khats": list(dict.fromkeys(e.info["khat"] for k, e in g.settings("t4").items()
                                     if b.names("t4", "pfedwireless", k))),
         "alphas": [e.info["alpha"] for m, e in b.methods("t3").items() if _planned(b, "t3", m)],
         "etas": [e.info["eta"] for m, e in b.methods("eta").items() if _planned(b, "eta", m)],
         "config": {}, "base": {}, "rounds": {}}
    for st in s["settings"]:
        e = t12[f"{st}-niid1"]
        s["config"][st] = os.path.relpath(e.config[0], g.root)
        base = load_raw(e.config[0])
        base["threads"] = 1
        base["rounds"] = s["rounds"][st] = b.config("t12", "pfedwireless", f"{st}-niid1")["rounds"]
        s["base"][st] = base
    return s


def names_of(setting, method, part, s, khat="K/3", schedule="ratio", alpha=None, eta=None) -> list[str]:
    """Run names (seed order) of one table cell."""
    b = s["b"]
    if eta is not None:
        m = next(k for k, e in b.methods("eta").items() if e.info["eta"] == eta)
        return list(b.names("eta", m, f"{setting}-{part}").values())
    if schedule == "linear":
        m = next(k for k, e in b.methods("t3").items() if e.info["alpha"] == alpha)
        return list(b.names("t3", m, f"{setting}-{part}").values())
    if khat != "K/3":
        group = "t4" if method in b.methods("t4") else "t5"
        st = next(k for k, e in b.grid.settings(group).items() if e.info == {"setting": setting, "part": part,
                                                                              "khat": khat})
        return list(b.names(group, method, st).values())
    return list(b.names("t12", method, f"{setting}-{part}").values())


def make_run(setting, method, part, seed, s, **kw) -> tuple[str]:
    return (names_of(setting, method, part, s, **kw)[s["seeds"].index(seed)],)


def base_raw(setting: str, s: dict) -> dict:
    return copy.deepcopy(s["base"][setting])


def num_devices(setting: str, s: dict) -> int:
    return int(s["base"][setting]["partition"]["num_clients"])


def _final(b, name: str) -> dict | None:
    """The final row with the personalized evaluation (``personal/*``: the runs with
    personal_eval = true, mfedavg, mfedprox, local) in place of the run's own (kept as
    ``_engine_accuracy``), the simulated time, the last round's diagnostics and the proposed
    method's uploads."""
    r = b.results.final(name)
    rows = b.results.rows(name)
    if r is None or "accuracy" not in r:
        return None
    if PERSONAL + "accuracy" not in r and any(x.name == name and x.raw.get("personal_eval") for x in b.runs):
        return None  # a run folder from before its config asked for personal_eval: not its global accuracy
    out = dict(r)
    if PERSONAL + "accuracy" in r:
        out["_engine_accuracy"] = r["accuracy"]
        out.update({k[len(PERSONAL):]: v for k, v in r.items() if k.startswith(PERSONAL)})
        out["_nonfinite"] = [k for k in ("accuracy", "test_loss") if k in out and not finite(out[k])] \
            + [k for k in r["_nonfinite"] if k == "train_loss"]  # of the personalized values
    out["_sim"] = float(sum(x.get("sim_time_s", 0.0) for x in rows))
    for k, v in rows[-1].items():
        if k.startswith(("xi_self/", "fomo_", "amp_")) and finite(v):
            out["_" + k] = float(v)
    if "uploads" in rows[0]:
        out["_uploads"] = float(np.mean([x["uploads"] for x in rows]))
        out["_forced"] = float(np.mean([x.get("uploads_forced", 0) for x in rows]))
    return out


def _vals(b, names: list[str], key: str = "accuracy") -> list[float]:
    return [float(r[key]) for n in names if (r := _final(b, n)) is not None and finite(r.get(key))]


def _ms(vals: list[float], n_expected: int, scale: float = 100.0, digits: int = 1) -> str:
    return ms(vals, n_expected, digits, scale)


_count = verdict_count


def _claims(rows: list[tuple[str, list[float], list[float], float, int]], unit: str) -> tuple[list[str], list[str]]:
    """Table lines for claims ``(text, a, b, scale, digits)`` meaning a > b; and the verdicts."""
    lines = [f"| claim | Δ ({unit}) | spread (std a + std b) | here |", "|---|---|---|---|"]
    verdicts = []
    for text, a, b, scale, digits in rows:
        if not a or not b:
            continue
        d, sp, v = verdict(a, b, scale)
        verdicts.append(v)
        lines.append(f"| {text} | {d:+.{digits}f} | {spread_text(sp, digits)} | {v} |")
    return (lines + [""] if verdicts else []), verdicts


# ----------------------------------------------------------------------------- report sections


def t12_section(s, raw) -> tuple[list[str], list[str]]:
    LABEL = s["label"]
    out, summary = [], []
    n = len(s["seeds"])
    for ti, setting in zip(("I", "II"), ("digits", "mfeat")):
        if setting not in s["settings"]:
            continue
        k = num_devices(setting, s)
        parts = s["parts"]
        out += [f"### Table {ti} analog: {setting} ({SETTING_TITLE[setting]}; the paper's {PAPER_DATA[setting]})", "",
                f"Personalized test accuracy after the last round, %, mean ± std over seeds {s['seeds']}; "
                f"K^ = K/3 = {max(1, round(k / 3))} of {k} devices (see the evaluation section). "
                f"Paper: its Table {ti} ({PAPER_DATA[setting]}).", "",
                "| method | " + " | ".join(PART_LABEL[p] for p in parts) + " | "
                + " | ".join(f"paper {PART_LABEL[p]}" for p in parts) + " |",
                "|---|" + "---|" * (2 * len(parts))]
        vals = {}
        for m in s["methods"]:
            cells = []
            for p in parts:
                v = _vals(raw, names_of(setting, m, p, s))
                vals[(m, p)] = v
                cells.append(_ms(v, n))
            paper = [f"{PAPER_T12[setting][m][PARTS.index(p)]:.2f}" for p in parts]
            out.append(f"| {LABEL[m]} | " + " | ".join(cells) + " | " + " | ".join(paper) + " |")
        out.append("")
        glob = [m for m in ("mfedavg", "mfedprox") if m in s["methods"]]
        if glob:
            cells = []
            for m in glob:
                for p in parts:
                    g = _vals(raw, names_of(setting, m, p, s), "_engine_accuracy")
                    if g:
                        cells.append(f"{LABEL[m]} {PART_LABEL[p]} {_ms(g, n)}")
            if cells:
                out += ["For reference, the global model on the whole test set (the engine's own evaluation, "
                        "both modalities): " + "; ".join(cells) + ".", ""]
        claims = []
        for p in parts:
            for m in [x for x in s["methods"] if x != "pfedwireless"]:
                claims.append((f"{PART_LABEL[p]}: Proposed > {LABEL[m]}", vals.get(("pfedwireless", p), []),
                               vals.get((m, p), []), 100.0, 1))
            for m in ("mfedavg", "mfedprox"):
                claims.append((f"{PART_LABEL[p]}: Local training > {LABEL[m]}", vals.get(("local", p), []),
                               vals.get((m, p), []), 100.0, 1))
        lines, verdicts = _claims(claims, "points")
        if lines:
            out += ["The paper's claims (sec. IV-B: the proposed method has the highest accuracy everywhere; "
                    "local training beats FedAvg and FedProx, which train one global model):", "", *lines]
        for p in parts:
            got = {m: vals[(m, p)] for m in s["methods"] if vals.get((m, p))}
            if got:
                rank = sorted(got, key=lambda m: -np.mean(got[m]))
                summary.append(f"- **{setting}, {PART_LABEL[p]}**: " + " > ".join(
                    f"{LABEL[m]} ({100 * np.mean(got[m]):.1f})" for m in rank)
                    + "; paper: " + " > ".join(
                    f"{LABEL[m]} ({PAPER_T12[setting][m][PARTS.index(p)]:.1f})" for m in sorted(
                        s["methods"], key=lambda m: -PAPER_T12[setting][m][PARTS.index(p)])) + ".")
        if verdicts:
            summary.append(f"  Table {ti}: " + _count(verdicts, f"Table {ti}"))
    return out, summary


def eval_section(s) -> list[str]:
    return [
        "| method | what is scored | where |", "|---|---|---|",
        "| Proposed (`pfedwireless`) | the model each device starts its next round from: W_k for the groups "
        "just aggregated for it, its own trained parameters otherwise (`eval_model = \"device\"`) | the run's "
        "own evaluation (final round) |",
        "| FedFomo, FedAMP | the server's copy of each device's latest model (= the device's own model) | the "
        "run's own evaluation (final round) |",
        "| FedAvg (`mfedavg`), FedProx (`mfedprox`) | the final global model, restricted to each device's "
        "modalities (`keep_only`) | the engine, `personal_eval = true` (final round, `personal/*`) |",
        "| Local training (`local`) | each device's own model (its client state) | the engine, "
        "`personal_eval = true` (final round, `personal/*`) |",
        "",
        "Every row is the engine's personalized evaluation (`mmfl.core.evaluation`) with the run seed: device "
        "k is scored on a seeded subset of the shared test set whose label distribution follows k's training labels "
        "(min(|test|, max(50, n_k)) rows), with only k's modalities; the accuracy is the mean over devices. "
        "The same seed gives every method the same test subsets. All devices train in every round of the "
        "proposed method and of local training; the other methods train K^ devices per round (a device that "
        "was never sampled would be scored with the initial weights; with these round counts every device "
        "is sampled).", ""]


def t3_section(s, raw) -> tuple[list[str], list[str]]:
    if "t3" not in s["groups"] or "digits" not in s["settings"]:
        return [], []
    n = len(s["seeds"])
    rows = [("ratio", names_of("digits", "pfedwireless", "niid1", s))]
    rows += [(a, names_of("digits", "pfedwireless", "niid1", s, schedule="linear", alpha=a)) for a in s["alphas"]]
    out = ["digits, non-IID-1, K^ = K/3. Accuracy: personalized, %; simulated training time: the sum over "
           "the rounds of the `[system]` model's round latency (s), mean ± std over seeds. The ratio row is the "
           "Table I run. The paper's times are for its 50 rounds of ResNet-18s; ours for "
           f"{s['rounds']['digits']} rounds of a small CNN at `bandwidth_hz = 1e5`, so only the ratios "
           "between rows compare. alpha multiplies a latency in seconds: the paper's rounds take ~100 s, ours "
           "~0.1-0.6 s, so the same alpha weighs latency far less here.", "",
           "| scheduling | accuracy | simulated time (s) | uploads / round | forced / round | paper accuracy "
           "| paper time (s) |", "|---|---|---|---|---|---|---|"]
    vals = {}
    for key, names in rows:
        acc = _vals(raw, names)
        sim = _vals(raw, names, "_sim")
        vals[key] = (acc, sim)
        label = "ratio (Alg. 1 line 6)" if key == "ratio" else f"linear, alpha = {key:g}"
        pa, pt = PAPER_T3.get(key, (None, None))
        out.append(f"| {label} | {_ms(acc, n)} | {_ms(sim, n, 1.0, 2)} | {_ms(_vals(raw, names, '_uploads'), n, 1.0)} "
                   f"| {_ms(_vals(raw, names, '_forced'), n, 1.0, 2)} | {pa if pa is not None else '—'} "
                   f"| {f'{pt:.3g}' if pt is not None else '—'} |")
    out.append("")
    claims = []
    al = sorted(s["alphas"])
    for lo, hi in zip(al, al[1:]):
        claims.append((f"accuracy: alpha {lo:g} > alpha {hi:g}", vals[lo][0], vals[hi][0], 100.0, 1))
    if len(al) > 1:
        claims.append((f"time: alpha {al[0]:g} > alpha {al[-1]:g} (larger alpha, shorter training)",
                       vals[al[0]][1], vals[al[-1]][1], 1.0, 2))
    for a in al:
        claims.append((f"accuracy: ratio > linear alpha {a:g}", vals["ratio"][0], vals[a][0], 100.0, 1))
    lines, verdicts = _claims(claims, "points or s")
    summary = []
    if lines:
        out += ["The paper's claims (sec. IV-B: a larger alpha lowers the latency and the accuracy; the ratio "
                "reaches a higher accuracy in the same training time):", "", *lines]
        summary.append("- **Table III** (digits, non-IID-1): " + _count(verdicts, "Table III"))
    return out, summary


def t4_section(s, raw) -> tuple[list[str], list[str]]:
    LABEL = s["label"]
    if "t4" not in s["groups"] or "digits" not in s["settings"]:
        return [], []
    n = len(s["seeds"])
    k = num_devices("digits", s)
    khats = [kh for kh in KHATS if kh in s["khats"]]
    out = [f"digits, personalized accuracy (%), mean ± std over seeds; K^ devices of K = {k}: the proposed "
           "method's uploaders per parameter group (every device trains), FedAvg's and FedAMP's devices per "
           "round. K/3 = the Table I runs.", "",
           "| partition | method | " + " | ".join(f"K^ = {kh}" for kh in khats) + " | "
           + " | ".join(f"paper {kh}" for kh in khats) + " |", "|---|---|" + "---|" * (2 * len(khats))]
    claims, summary = [], []
    for part in s["parts"]:
        for m in s["t4_methods"]:
            cells, v = [], {}
            for kh in khats:
                v[kh] = _vals(raw, names_of("digits", m, part, s, khat=kh))
                cells.append(_ms(v[kh], n))
            paper = PAPER_T4[(part, m)]
            out.append(f"| {PART_LABEL[part]} | {LABEL[m]} | " + " | ".join(cells) + " | "
                       + " | ".join(f"{paper[list(KHATS).index(kh)]:.2f}" for kh in khats) + " |")
            if m == "pfedwireless" and "K/3" in v and "K" in v:
                claims.append((f"{PART_LABEL[part]}: Proposed at K^ = K > at K/3", v["K"], v["K/3"], 100.0, 1))
        pw = {kh: _vals(raw, names_of("digits", "pfedwireless", part, s, khat=kh)) for kh in khats}
        for m in ("mfedavg", "fedamp"):
            for kh in khats:
                claims.append((f"{PART_LABEL[part]}, K^ = {kh}: Proposed > {LABEL[m]}", pw[kh],
                               _vals(raw, names_of("digits", m, part, s, khat=kh)), 100.0, 1))
    out.append("")
    lines, verdicts = _claims(claims, "points")
    if lines:
        out += ["The paper's claims (sec. IV-B: \"an overall improvement in performance with the increase of "
                "K^\"; the proposed method above FedAvg and FedAMP at every K^, as in its Table IV):", "", *lines]
        summary.append("- **Table IV** (digits): " + _count(verdicts, "Table IV"))
    return out, summary


def t5_section(s, raw) -> tuple[list[str], list[str]]:
    LABEL = s["label"]
    if "t5" not in s["groups"] or "digits" not in s["settings"]:
        return [], []
    n = len(s["seeds"])
    khats = [kh for kh in KHATS if kh in s["khats"]]
    out = ["digits, non-IID-1. Simulated training time (s): the sum over the rounds of the slowest device's "
           "download + computation + upload (`[system]`, docs/system.md), mean ± std over seeds; MB = payload "
           "bytes per round, up + down, all devices of the round. The paper's times are for its 50 rounds of "
           f"ResNet-18s; ours for {s['rounds']['digits']} rounds of a small CNN, so compare ratios between "
           "rows.", "",
           "| method | " + " | ".join(f"time, K^ = {kh}" for kh in khats) + " | "
           + " | ".join(f"MB / round, {kh}" for kh in khats) + " | "
           + " | ".join(f"paper {kh}" for kh in khats) + " |", "|---|" + "---|" * (3 * len(khats))]
    t = {}
    for m in s["t5_methods"]:
        cells, mb = [], []
        for kh in khats:
            names = names_of("digits", m, "niid1", s, khat=kh)
            t[(m, kh)] = _vals(raw, names, "_sim")
            cells.append(_ms(t[(m, kh)], n, 1.0, 2))
            up, down = _vals(raw, names, "_mb_up"), _vals(raw, names, "_mb_down")
            mb.append(f"{np.mean(up) + np.mean(down):.2f}" if up and down else "—")
        out.append(f"| {LABEL[m]} | " + " | ".join(cells) + " | " + " | ".join(mb) + " | "
                   + " | ".join(f"{PAPER_T5[m][list(KHATS).index(kh)]:.3g}" for kh in khats) + " |")
    out.append("")
    claims = []
    for kh in khats:
        if kh != "K":
            claims.append((f"K^ = {kh}: FedAvg's time > Proposed's", t[("mfedavg", kh)], t[("pfedwireless", kh)],
                           1.0, 2))
        claims.append((f"K^ = {kh}: FedFomo's time > FedAvg's", t[("fedfomo", kh)], t[("mfedavg", kh)], 1.0, 2))
        claims.append((f"K^ = {kh}: FedFomo's time > Proposed's", t[("fedfomo", kh)], t[("pfedwireless", kh)],
                       1.0, 2))
    lines, verdicts = _claims(claims, "s")
    summary = []
    if lines:
        out += ["The paper's claims (sec. IV-B: the proposed method is faster than FedAvg by scheduling; FedFomo, "
                "which downloads every other device's parameters, is the slowest; at K^ = K the proposed method "
                "and FedAvg move the same parameters):", "", *lines]
        summary.append("- **Table V** (digits, non-IID-1): " + _count(verdicts, "Table V"))
    return out, summary


def comm_section(s, raw) -> list[str]:
    LABEL = s["label"]
    n = len(s["seeds"])
    out = ["Non-IID-1, K^ = K/3, mean over seeds: payload MB per round (all devices of the round), the "
           "simulated training time, and the wall time of the run on this machine (one thread).", "",
           "| setting | method | MB up / round | MB down / round | simulated time (s) | run wall s |",
           "|---|---|---|---|---|---|"]
    for setting in s["settings"]:
        for m in s["methods"]:
            names = names_of(setting, m, "niid1", s)
            out.append(f"| {setting} | {LABEL[m]} | {_ms(_vals(raw, names, '_mb_up'), n, 1.0, 3)} | "
                       f"{_ms(_vals(raw, names, '_mb_down'), n, 1.0, 3)} | {_ms(_vals(raw, names, '_sim'), n, 1.0, 2)} "
                       f"| {_ms(_vals(raw, names, '_wall'), n, 1.0, 0)} |")
    return out + [""]


def diag_section(s, raw) -> list[str]:
    """What the personalized methods' own metrics say about how they ran."""
    out = ["Final round, mean over seeds. FedFomo: `fomo_positive` = peers with a positive weight per device, "
           "`fomo_kept_own` = share of devices whose every weight was 0 (they keep their own model: local "
           "training). FedAMP: `amp_self_weight` = mean xi_ii of eq. 5. Proposed: mean xi~_kk per group "
           "(1/K at the start), uploads per round (K^ per group plus the forced ones).", "",
           "| setting | partition | FedFomo positive | FedFomo kept own | FedAMP self weight | Proposed xi~_kk "
           "(per group) | Proposed uploads / round (forced) |", "|---|---|---|---|---|---|---|"]

    def mean(names, key, digits=3):
        v = _vals(raw, names, key)
        return f"{np.mean(v):.{digits}f}" if v else "—"

    for setting in s["settings"]:
        for p in s["parts"]:
            pw = names_of(setting, "pfedwireless", p, s)
            r0 = next((r for r in (_final(raw, x) for x in pw) if r), None)
            groups = sorted(k[len("_xi_self/"):] for k in (r0 or {}) if k.startswith("_xi_self/"))
            xi = ", ".join(f"{g} {mean(pw, '_xi_self/' + g, 4)}" for g in groups) or "—"
            fomo, amp = names_of(setting, "fedfomo", p, s), names_of(setting, "fedamp", p, s)
            out.append(f"| {setting} | {PART_LABEL[p]} | {mean(fomo, '_fomo_positive', 2)} "
                       f"| {mean(fomo, '_fomo_kept_own', 2)} | {mean(amp, '_amp_self_weight', 3)} | {xi} "
                       f"| {mean(pw, '_uploads', 1)} ({mean(pw, '_forced', 2)}) |")
    return out + [""]


def eta_section(s, raw) -> tuple[list[str], list[str]]:
    if "eta" not in s["groups"]:
        return [], []
    n = len(s["seeds"])
    etas = [PAPER_ETA] + list(s["etas"])
    out = ["Non-IID-1, K^ = K/3: the proposed method's accuracy (%) and its coefficients at the end (mean "
           "xi~_kk per group over the devices holding it, mean over seeds; 1/K at the start), by eta^ "
           "(0.01 = the paper's, the Table I/II run). A sensitivity check on the test set, not a tuned "
           "result.", "", "| setting | eta^ | accuracy | xi~_kk at the end | simulated time (s) |",
           "|---|---|---|---|---|"]
    summary = []
    for setting in s["settings"]:
        acc = {}
        for eta in etas:
            names = names_of(setting, "pfedwireless", "niid1", s, **({} if eta == PAPER_ETA else {"eta": eta}))
            acc[eta] = _vals(raw, names)
            r0 = next((r for r in (_final(raw, x) for x in names) if r), None)
            groups = sorted(k[len("_xi_self/"):] for k in (r0 or {}) if k.startswith("_xi_self/"))
            xi = ", ".join(f"{g} {np.mean(_vals(raw, names, '_xi_self/' + g)):.3f}" for g in groups) or "—"
            out.append(f"| {setting} | {eta:g}{' (paper)' if eta == PAPER_ETA else ''} | {_ms(acc[eta], n)} | {xi} "
                       f"| {_ms(_vals(raw, names, '_sim'), n, 1.0, 2)} |")
        got = {e: v for e, v in acc.items() if v}
        if len(got) > 1:
            best = max(got, key=lambda e: np.mean(got[e]))
            d, sp, v = verdict(got[best], got[PAPER_ETA], 100.0) if best != PAPER_ETA else (0.0, float("nan"), "—")
            summary.append(f"- **{setting}, eta^**: " + ", ".join(f"{e:g}: {100 * np.mean(got[e]):.1f}" for e in got)
                           + (f"; the best, eta^ = {best:g}, is {d:+.1f} points above the paper's 0.01 ({v})"
                              if best != PAPER_ETA else "; the paper's 0.01 is the best") + ".")
    return out + [""], summary


def fig3_section(s, raw, png: Path) -> tuple[list[str], list[str]]:
    """Fig. 3 analog: xi~ of one device over the rounds, per group, from xi_history.json."""
    if "digits" not in s["settings"] or not ({"t12", "eta"} & set(s["groups"])):
        return [], []
    seed = s["fig3_seed"]
    etas = ([PAPER_ETA] if "t12" in s["groups"] and "niid1" in s["parts"] else []) + \
        (list(s["etas"]) if "eta" in s["groups"] else [])
    hists = {}
    for eta in etas:
        name = make_run("digits", "pfedwireless", "niid1", seed, s, **({} if eta == PAPER_ETA else {"eta": eta}))[0]
        p = raw.raw / name / "xi_history.json"
        if p.exists():
            hists[eta] = (name, json.loads(p.read_text()))
    if not hists:
        return ["No `xi_history.json` yet (the digits non-IID-1 runs of seed "
                f"{seed} write it).", ""], []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(hists.values()))[1]
    K = first["num_clients"]
    holds, classes = first["holds"], first["classes"]
    mods = [g for g in first["xi_tilde"] if g != "shared"]
    groups = [*mods, "shared"]
    def kinds(k):  # how many of the buckets "2-3 / 1 / 0 classes shared" device k has partners in
        return len({min(len(set(classes[k]) & set(classes[c])), 2) for c in range(K) if c != k})

    multi = [c for c in range(K) if len(holds[c]) == len(mods)] or list(range(K))
    device = max(multi, key=lambda c: (kinds(c), -c))  # the multimodal device with the most kinds of partner
    shared_with = {c: len(set(classes[device]) & set(classes[c])) for c in range(K)}
    colors = {3: "tab:green", 2: "tab:blue", 1: "tab:orange", 0: "tab:red"}
    out = [f"digits, non-IID-1, seed {seed}, K^ = K/3, ratio scheduling. Device {device} (holds "
           f"{' + '.join(holds[device])}; classes {classes[device]}); xi~_(k,k') = the row softmax of Xi (eq. 4) "
           f"after each round, for every device k' that holds the group (1/K = {1 / K:.4f} at the start). "
           f"Figure: `{png.relative_to(s['b'].grid.root) if png.is_relative_to(s['b'].grid.root) else png}` (rows: eta^; columns: "
           "groups; black = the device itself, colours = the number of classes k' shares with it: green 3, "
           "blue 2, orange 1, red 0).", "",
           "Devices: " + "; ".join(f"{c} ({'+'.join(holds[c])}, {shared_with[c]} shared)" for c in range(K)
                                    if c != device) + ".", "",
           "Final xi~, the device's own row, by how many classes the other device shares with it (mean over "
           "those devices); and the same over **every** device holding the group (mean over devices k of the "
           "mean over k'):", "",
           "| eta^ | group | own xi~_kk | others, 2-3 shared | 1 shared | 0 shared | all devices: own | "
           "all: 2-3 shared | all: 0-1 shared |", "|---|---|---|---|---|---|---|---|---|"]
    summary = []
    fig, axes = plt.subplots(len(hists), len(groups), figsize=(4.2 * len(groups), 2.9 * len(hists)),
                             squeeze=False)
    for row, (eta, (name, h)) in enumerate(hists.items()):
        rounds = [0] + h["rounds"]
        checks = []
        for col, g in enumerate(groups):
            ax = axes[row][col]
            xs = h["xi_tilde"].get(g)
            if xs is None or (g != "shared" and g not in holds[device]):
                ax.set_visible(False)
                continue
            xs = np.array(xs)  # [R, K, K]
            holders = [c for c in range(K) if g == "shared" or g in holds[c]]
            for c in holders:
                series = [1 / K] + list(xs[:, device, c])
                if c == device:
                    ax.plot(rounds, series, color="k", lw=2.2, label="own")
                else:
                    ax.plot(rounds, series, color=colors[min(shared_with[c], 3)], lw=1,
                            alpha=0.85)
            ax.set_title(f"eta^ = {eta:g}, group '{g}'", fontsize=9)
            ax.set_xlabel("round")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_ylabel("xi~ (device %d)" % device)
            ax.grid(alpha=0.3)
            fin = xs[-1]
            own = fin[device, device]

            def bucket(k, pred):
                v = [fin[k, c] for c in holders if c != k
                     and pred(len(set(classes[k]) & set(classes[c])))]
                return float(np.mean(v)) if v else float("nan")

            hi, one, zero = bucket(device, lambda x: x >= 2), bucket(device, lambda x: x == 1), \
                bucket(device, lambda x: x == 0)
            all_own = float(np.mean([fin[k, k] for k in holders]))
            all_hi = _nanmean([bucket(k, lambda x: x >= 2) for k in holders])
            all_lo = _nanmean([bucket(k, lambda x: x <= 1) for k in holders])
            f = (lambda x: "—" if np.isnan(x) else f"{x:.4f}")
            out.append(f"| {eta:g} | {g} | {own:.4f} | {f(hi)} | {f(one)} | {f(zero)} | {all_own:.4f} | {f(all_hi)} "
                       f"| {f(all_lo)} |")
            checks.append((g, all_own, all_hi, all_lo))
        moved = [c for c in checks if c[1] > 1 / K + 1e-3]
        comparable = [c for c in checks if not (np.isnan(c[2]) or np.isnan(c[3]))]
        order = [c for c in comparable if c[2] > c[3] + 1e-4]
        summary.append(f"- **Fig. 3, eta^ = {eta:g}** (every device, final round): the own coefficient rose above "
                       f"1/K = {1 / K:.4f} by more than 0.001 in {len(moved)} of {len(checks)} groups ("
                       + ", ".join(f"{g} {o:.4f}" for g, o, _, _ in checks)
                       + f"); partners sharing 2-3 classes kept more weight than those sharing 0-1 (by more than "
                       f"1e-4) in {len(order)} of {len(comparable)} groups ("
                       + ", ".join(f"{g} {hi:.4f} vs {lo:.4f}" for g, _, hi, lo in comparable) + ").")
    handles = [plt.Line2D([], [], color="k", lw=2.2, label="own")] + [
        plt.Line2D([], [], color=colors[k], label=f"{k} classes shared") for k in (3, 2, 1, 0)]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return out + [""], summary


def _nanmean(v: list[float]) -> float:
    v = [x for x in v if not np.isnan(x)]
    return float(np.mean(v)) if v else float("nan")


def findings(s, raw) -> list[str]:
    """Statements read off the numbers."""
    LABEL = s["label"]
    out = []
    for setting in s["settings"]:
        for p in s["parts"]:
            got = {m: _vals(raw, names_of(setting, m, p, s)) for m in s["methods"]}
            got = {m: v for m, v in got.items() if v}
            if not got:
                continue
            best = max(got, key=lambda m: np.mean(got[m]))
            pw = got.get("pfedwireless")
            parts = [f"best {LABEL[best]} ({100 * np.mean(got[best]):.1f})"]
            if pw and best != "pfedwireless":
                parts.append(f"Proposed {100 * np.mean(pw):.1f} ({100 * (np.mean(pw) - np.mean(got[best])):+.1f} vs "
                             f"the best)")
            if "local" in got and pw:
                parts.append(f"Proposed − Local {100 * (np.mean(pw) - np.mean(got['local'])):+.1f}")
            if "mfedavg" in got and pw:
                parts.append(f"Proposed − FedAvg {100 * (np.mean(pw) - np.mean(got['mfedavg'])):+.1f}")
            out.append(f"- **{setting}, {PART_LABEL[p]}**: " + "; ".join(parts) + ".")
        ko = _vals(raw, [x for p in s["parts"] for x in names_of(setting, "fedfomo", p, s)], "_fomo_kept_own")
        if ko:
            out.append(f"- **{setting}**: FedFomo's devices kept their own model (every weight 0) in "
                       f"{100 * np.mean(ko):.0f}% of the cases in the final round, averaged over partitions and "
                       "seeds: there it acts as local training.")
        xs = _vals(raw, [x for p in s["parts"] for x in names_of(setting, "pfedwireless", p, s)], "_xi_self/shared")
        if xs:
            k = num_devices(setting, s)
            out.append(f"- **{setting}**: with the paper's eta^ = 0.01, the proposed method's mean xi~_kk of the "
                       f"shared group ends at {np.mean(xs):.4f} (1/K = {1 / k:.4f}): the coefficients stay "
                       "practically uniform, so its aggregation is a plain average over the round's uploaders "
                       "of each group.")
    if "t3" in s["groups"] and "digits" in s["settings"]:
        ratio = {seed: _final(raw, make_run("digits", "pfedwireless", "niid1", seed, s)[0]) for seed in s["seeds"]}
        same = []
        for a in s["alphas"]:
            n_same = n_all = 0
            for seed in s["seeds"]:
                r = _final(raw, make_run("digits", "pfedwireless", "niid1", seed, s, schedule="linear", alpha=a)[0])
                if r is None or ratio[seed] is None:
                    continue
                n_all += 1
                n_same += int(r["accuracy"] == ratio[seed]["accuracy"] and abs(r["_sim"] - ratio[seed]["_sim"]) < 1e-9)
            if n_all:
                same.append(f"alpha {a:g}: {n_same} of {n_all}")
        if same:
            out.append("- **Table III**: linear runs identical to the ratio run of the same seed (same accuracy and "
                       "simulated time): " + "; ".join(same) + ". While 1 − xi~_kk is the same for every device "
                       "(Xi uniform), both metrics rank the devices by latency alone and schedule the same uploads; "
                       "they differ only where alpha times the latency gap is smaller than the spread of 1 − xi~_kk.")
    if "t4" in s["groups"] and "digits" in s["settings"]:
        for part in s["parts"]:
            v = {kh: _vals(raw, names_of("digits", "pfedwireless", part, s, khat=kh)) for kh in s["khats"]}
            fa = {kh: _vals(raw, names_of("digits", "mfedavg", part, s, khat=kh)) for kh in s["khats"]}
            if all(v.values()) and all(fa.values()):
                out.append(f"- **digits, {PART_LABEL[part]}, K^**: Proposed " + ", ".join(
                    f"{kh} {100 * np.mean(v[kh]):.1f}" for kh in s["khats"]) + "; FedAvg " + ", ".join(
                    f"{kh} {100 * np.mean(fa[kh]):.1f}" for kh in s["khats"]) + ".")
    return out


# ----------------------------------------------------------------------------- the report


def _fmt_cycles(c) -> str:
    return f"U[{c[0]:g}, {c[1]:g}]" if isinstance(c, (list, tuple)) else f"{c:g}"


def scale_lines(s) -> list[str]:
    LABEL = s["label"]
    from mmfl.config import resolve
    from mmfl.data.federation import build_federation

    out = []
    for setting in s["settings"]:
        raw = base_raw(setting, s)
        cfg = resolve(raw)
        fed = build_federation(cfg)
        combos: dict[str, int] = {}
        for c in range(fed.num_clients):
            key = "+".join(fed.modalities_of(c))
            combos[key] = combos.get(key, 0) + 1
        dp = ", ".join(f"{k}={v}" for k, v in vars(cfg.data.params).items()
                       if k in ("num_train", "num_test", "image_noise", "audio_noise", "views"))
        mv = cfg.model.values
        a = cfg.algorithm.params
        sy = cfg.system
        t = cfg.train
        out.append(f"- **{setting}** (`{s['config'][setting]}`): data `{cfg.data.name}` ({dp}; {len(fed.test)} test rows, "
                   f"{cfg.data.name != 'mfeat' and 'class-paired' or 'instance-paired'}); {fed.num_clients} devices "
                   f"holding " + ", ".join(f"{v}× {k}" for k, v in sorted(combos.items(), key=lambda x: -x[1]))
                   + f" (`[modalities] {cfg.modalities.name}`); {cfg.run.rounds} rounds; model multimodal feat_dim "
                   f"{mv.get('feat_dim')}, "
                   + ", ".join(f"{kk} {mv[kk]}" for kk in ("cnn_channels", "mlp_hidden") if kk in mv)
                   + f", fusion {mv.get('fusion')}; {t.optimizer} lr {t.lr} momentum {t.momentum}, batch "
                   f"{t.batch_size}, {t.local_epochs} local epoch(s); proposed: eta^ {a.eta_hat}, A^th {a.a_th}, "
                   f"grad_estimate {a.grad_estimate}; `[system]` bandwidth {sy.bandwidth_hz:g} Hz, f_k "
                   f"{_fmt_cycles(sy.cycles_per_s)} cycles/s, other values the defaults (docs/system.md).")
    defaults = []
    for m in ("mfedprox", "fedfomo", "fedamp"):
        raw = base_raw(s["settings"][0], s)
        raw["algorithm"] = {"name": m}
        p = resolve(raw).algorithm.params
        family = {f.name for f in dataclasses.fields(FedAvgParams)}  # the aggregation rule: FedAvg's, not the method's
        defaults.append(f"{LABEL[m]} " + ", ".join(f"{k} {v}" for k, v in vars(p).items()
                                                   if k not in family or v != getattr(FedAvgParams(), k)))
    out.append("- Baselines with their registered defaults (the paper gives none): " + "; ".join(defaults) + ".")
    return out


def report(b) -> list[str]:
    s, raw = context(b), b
    quick = b.params.get("quick", False)
    png = (b.raw if quick else b.grid.report.parent) / "wireless_fig3.png"
    planned = [(r.name, r.raw) for r in b.runs]
    finished = [n for n, r in planned if done(b.raw / n, r)]
    failed = sorted((p.parent.name, p.read_text().strip()) for p in b.raw.glob("*/failed.txt")
                    if p.parent.name in {n for n, _ in planned})
    run_s, nonfinite = 0.0, []
    for n in finished:
        r = _final(raw, n) or {}
        run_s += r.get("_wall", 0.0)
        if r.get("_nonfinite"):
            nonfinite.append((n, r["_nonfinite"]))
    last = b.last_invocation()
    cmd = b.params["command"]
    out = [
        "# Wireless personalized FMML benchmark (paper 004: Tables I-V, Fig. 3)"
        + (" — QUICK smoke run, not results" if quick else ""), "",
        f"Regenerate: `{cmd}` (finished runs in `{os.path.relpath(b.raw, b.grid.root)}/` are reused; `--tables-only` "
        "rebuilds this file; `--workers N` sets the worker processes).", "",
        "## Scale", "",
        *scale_lines(s),
        "- Partitions: non-IID-1 `k_classes` k = 3; non-IID-2 / 3 `dominant_class` fraction 0.5 / 0.3 "
        "(docs/algorithms/fedamp.md lists how they differ from the paper's wording).",
        "- K^ (the paper's Tables I-II use K^ = K/3): the proposed method's uploaders per parameter group, "
        "with every device training every round; FedAvg's, FedProx's, FedFomo's and FedAMP's devices per round "
        "(the same cohorts for the same seed); local training: every device every round.",
        f"- Seeds {s['seeds']} (run seed: model init, partition, modality assignment, cohorts, the `[system]` "
        "placement and fading, the personalized test subsets; the data sets' own splits are fixed); "
        "mean ± std (population, ddof 0) over seeds.",
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
    out += ["## Evaluation: personalized, the same for every method", "", *eval_section(s)]
    summary = []
    if "t12" in s["groups"]:
        lines, summ = t12_section(s, raw)
        summary += summ
        out += ["## Tables I and II: accuracy", "", *lines]
    for title, fn in (("## Table III: ratio vs linear scheduling", t3_section),
                      ("## Table IV: K^", t4_section),
                      ("## Table V: simulated training time", t5_section)):
        lines, summ = fn(s, raw)
        if lines:
            summary += summ
            out += [title, "", *lines]
    lines, summ = fig3_section(s, raw, png)
    if lines:
        summary += summ
        out += ["## Fig. 3: the aggregation coefficients of one device", "", *lines]
    lines, summ = eta_section(s, raw)
    if lines:
        summary += summ
        out += ["## eta^: how far the coefficients move", "", *lines]
    if "t12" in s["groups"] and "niid1" in s["parts"]:
        out += ["## Communication and time", "", *comm_section(s, raw)]
    if "t12" in s["groups"]:
        out += ["## Diagnostics of the personalized methods", "", *diag_section(s, raw)]
    out += ["## Does the paper's ordering hold?", "",
            "Computed from the tables above: a claim 'a > b' *holds beyond the spread* when "
            "mean(a) − mean(b) > std(a) + std(b), *within the spread* when it is positive but smaller; "
            "likewise *reversed*.", "", *summary, ""]
    out += ["## Findings (generated from the numbers above)", "", *findings(s, raw), ""]
    analysis = HERE / "analysis.md"
    if analysis.exists() and not quick:
        out += ["## Reading the results", "", analysis.read_text().strip(), ""]
    return out + [""]
