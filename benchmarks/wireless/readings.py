"""What the wireless tables read (grid: grid.toml): the grid's context (seeds, settings, partitions,
K^ values, alphas, etas), the run names of a table cell, and each run's final row with the
personalized evaluation in place of its own (``personal/*``) and the simulated time, diagnostics and
uploads read off its rows."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import numpy as np

from mmfl.bench import finite, ms

HERE = Path(__file__).resolve().parent
SETTING_TITLE = {"digits": "audio-visual digits (FSDD audio + MNIST image, class-paired, noisy), 9 devices",
                 "mfeat": "mfeat, three views (pix image, fou, zer), 18 devices"}

PAPER_DATA = {"digits": "CREMA-D", "mfeat": "MOSEI"}

PARTS = ["niid1", "niid2", "niid3"]

PART_LABEL = {"niid1": "non-IID-1", "niid2": "non-IID-2", "niid3": "non-IID-3"}

PERSONAL = "personal/"  # the engine's personalized evaluation of the runs with personal_eval = true

KHATS = {"K/3": 1 / 3, "2K/3": 2 / 3, "K": 1.0}

PAPER_ETA = 0.01


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
        if f"{setting}-{part}" not in b.grid.settings("eta"):  # a grid restricted to some settings (paired.py)
            return []
        return list(b.names("eta", m, f"{setting}-{part}").values())
    if schedule == "linear":
        m = next(k for k, e in b.methods("t3").items() if e.info["alpha"] == alpha)
        return list(b.names("t3", m, f"{setting}-{part}").values())
    if khat != "K/3":
        group = "t4" if method in b.methods("t4") else "t5"
        st = next((k for k, e in b.grid.settings(group).items() if e.info == {"setting": setting, "part": part,
                                                                               "khat": khat}), None)
        if st is None:  # a grid restricted to some settings (paired.py)
            return []
        return list(b.names(group, method, st).values())
    if f"{setting}-{part}" not in b.grid.settings("t12"):  # a grid restricted to some settings (paired.py)
        return []
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


class SeedVals(list):
    """A table cell's values in seed order, with ``.seeds``: the seed of each value (the paired
    tests of ``sections.claim_table`` match two cells on them)."""

    seeds: list


def _seed_of(name: str) -> int | None:
    m = re.search(r"-s(\d+)$", name)  # every run template of grid.toml ends in -s{seed}
    return int(m.group(1)) if m else None


def _vals(b, names: list[str], key: str = "accuracy") -> SeedVals:
    out = SeedVals()
    out.seeds = []
    for n in names:
        if (r := _final(b, n)) is not None and finite(r.get(key)):
            out.append(float(r[key]))
            out.seeds.append(_seed_of(n))
    return out


def _ms(vals: list[float], n_expected: int, scale: float = 100.0, digits: int = 1) -> str:
    return ms(vals, n_expected, digits, scale)
