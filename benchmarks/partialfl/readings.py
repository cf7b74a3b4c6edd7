"""What the PartialFL tables read (grid: grid.toml): the grid's context (seeds, settings, each
group's rows, each setting's base config), the run names of a table cell, each run's final row
with PartialFL's byte readings, and facts of a setting (clients, modalities, pooled upload)."""

from __future__ import annotations

import copy
import os

import numpy as np

from mmfl.bench import finite, ms

SETTING_TITLE = {"digits": "spoken digits: FSDD audio (private) + MNIST image (shareable), one client per speaker",
                 "emoji": "emoji: image (private) + name embedding (shareable), 99 subcategories, Dirichlet"}
# the paper's metric per setting: UAR for speech (IEMOCAP / MSP-Improv), top-5 for Food-101
PRIMARY = {"digits": "uar", "emoji": "accuracy_top5"}
METRICS = [("uar", "UAR"), ("accuracy", "top-1"), ("accuracy_top5", "top-5")]
VARIANTS = ["private", "both"]
VLABEL = {"private": "uni-modal global model (private modality only)",
          "both": "multimodal global model (both modalities, fusion sum)"}


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
