"""A table-spec kind (:mod:`mmfl.bench.spec`) for aggregation coefficients among devices kept over the
rounds (the pfedwireless benchmark's Fig. 3): ``coef_history`` reads a JSON file each run wrote
(``file``; ``rounds``, ``xi_tilde = {group: [round][k][k']]}`` row-stochastic, ``num_clients``,
``holds`` (each device's modalities), ``classes`` (each device's labels)) for the runs ``runs = [{ group,
method, setting, label }]`` at the grid's first seed, picks the device that holds every modality
with partners of the most kinds (2-3 / 1 / 0 classes shared), draws one panel per (run, group) of its
row over the rounds (``figure``: the PNG's name, in the report's folder, or the run folder with
``figure_dir = "raw"``) and writes ``intro`` (``{device}``, ``{holds}``, ``{classes}``, ``{inv_k}``,
``{figure}``), ``devices`` (``{items}``, each ``device_item``: ``{c}``, ``{holds}``, ``{shared}``),
``table_intro`` and a row per (run, group) of the final coefficients by class-sharing bucket;
``missing`` where no run has the file. ``summary``: instead one line per run (``{label}``, ``{inv_k}``,
``{moved}``, ``{groups}``, ``{own}``, ``{order}``, ``{comparable}``, ``{pairs}``), drawing nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

COLORS = {3: "tab:green", 2: "tab:blue", 1: "tab:orange", 0: "tab:red"}
HEAD = ["{label_head}", "group", "own xi~_kk", "others, 2-3 shared", "1 shared", "0 shared", "all devices: own",
        "all: 2-3 shared", "all: 0-1 shared"]


def _nanmean(v: list[float]) -> float:
    v = [x for x in v if not np.isnan(x)]
    return float(np.mean(v)) if v else float("nan")


def _histories(b, block: dict) -> dict:
    seed = block.get("seed", b.grid.seeds[0])
    out = {}
    for r in block["runs"]:
        g = r.get("group", block.get("group"))
        if r["method"] not in b.methods(g) or r.get("setting") not in b.grid.settings(g):
            continue
        name = b.names(g, r["method"], r.get("setting")).get(seed)
        if name and (p := b.raw / name / block.get("file", "xi_history.json")).exists():
            out[r["label"]] = json.loads(p.read_text())
    return out


def _device(h: dict) -> tuple[int, list[str], list[str]]:
    """The multimodal device with partners of the most kinds (ties: the lowest index); groups, modalities."""
    K, holds, classes = h["num_clients"], h["holds"], h["classes"]
    mods = [g for g in h["xi_tilde"] if g != "shared"]

    def kinds(k):
        return len({min(len(set(classes[k]) & set(classes[c])), 2) for c in range(K) if c != k})
    multi = [c for c in range(K) if len(holds[c]) == len(mods)] or list(range(K))
    return max(multi, key=lambda c: (kinds(c), -c)), [*mods, "shared"], mods


def _row(h: dict, device: int, g: str) -> tuple | None:
    """(holders, xs [R, K, K], own, hi, one, zero, all_own, all_hi, all_lo) of group ``g``; None if not held."""
    K, holds, classes = h["num_clients"], h["holds"], h["classes"]
    xs = h["xi_tilde"].get(g)
    if xs is None or (g != "shared" and g not in holds[device]):
        return None
    xs = np.array(xs)
    holders = [c for c in range(K) if g == "shared" or g in holds[c]]
    fin = xs[-1]

    def bucket(k, pred):
        v = [fin[k, c] for c in holders if c != k and pred(len(set(classes[k]) & set(classes[c])))]
        return float(np.mean(v)) if v else float("nan")
    return (holders, xs, fin[device, device], bucket(device, lambda x: x >= 2), bucket(device, lambda x: x == 1),
            bucket(device, lambda x: x == 0), float(np.mean([fin[k, k] for k in holders])),
            _nanmean([bucket(k, lambda x: x >= 2) for k in holders]), _nanmean([bucket(k, lambda x: x <= 1) for k in holders]))


def coef_history(b, block: dict, f) -> list[str]:
    hists = _histories(b, block)
    if not hists:
        return [] if "summary" in block else [f.fill(block["missing"])]
    first = next(iter(hists.values()))
    K, holds, classes = first["num_clients"], first["holds"], first["classes"]
    device, groups, _ = _device(first)
    if "summary" in block:
        return [_summary(b, block, f, label, h, device, groups, K) for label, h in hists.items()]
    plt = _plt()
    shared_with = {c: len(set(classes[device]) & set(classes[c])) for c in range(K)}
    where = b.raw if f.fill(block.get("figure_dir", "report")) == "raw" else Path(b.grid.report).parent
    png = where / f.fill(block["figure"])
    shown = os.path.relpath(png, b.grid.root) if png.is_relative_to(b.grid.root) else png
    out = [f.fill(block["intro"], device=device, holds=" + ".join(holds[device]), classes=classes[device],
                  inv_k=1 / K, figure=shown), "",
           f.fill(block["devices"], items="; ".join(
               f.fill(block["device_item"], c=c, holds="+".join(holds[c]), shared=shared_with[c])
               for c in range(K) if c != device)), "",
           f.fill(block["table_intro"]), "",
           "| " + " | ".join(f.fill(x, label_head=block.get("label_head", "run")) for x in HEAD) + " |",
           "|" + "---|" * len(HEAD)]
    fig, axes = plt.subplots(len(hists), len(groups), figsize=(4.2 * len(groups), 2.9 * len(hists)), squeeze=False)
    d4 = (lambda x: "—" if np.isnan(x) else f"{x:.4f}")
    for i, (label, h) in enumerate(hists.items()):
        rounds = [0] + h["rounds"]
        for j, g in enumerate(groups):
            ax = axes[i][j]
            r = _row(h, device, g)
            if r is None:
                ax.set_visible(False)
                continue
            holders, xs, own, hi, one, zero, all_own, all_hi, all_lo = r
            for c in holders:
                series = [1 / K] + list(xs[:, device, c])
                if c == device:
                    ax.plot(rounds, series, color="k", lw=2.2, label="own")
                else:
                    ax.plot(rounds, series, color=COLORS[min(shared_with[c], 3)], lw=1, alpha=0.85)
            ax.set_title(f.fill(block.get("panel_title", "{label}, group '{group}'"), label=label, group=g), fontsize=9)
            ax.set_xlabel("round")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_ylabel("xi~ (device %d)" % device)
            ax.grid(alpha=0.3)
            out.append(f"| {label} | {g} | {own:.4f} | {d4(hi)} | {d4(one)} | {d4(zero)} | {all_own:.4f} | {d4(all_hi)} "
                       f"| {d4(all_lo)} |")
    handles = [plt.Line2D([], [], color="k", lw=2.2, label="own")] + [
        plt.Line2D([], [], color=COLORS[k], label=f"{k} classes shared") for k in (3, 2, 1, 0)]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return out


def _summary(b, block: dict, f, label: str, h: dict, device: int, groups: list[str], K: int) -> str:
    checks = [(g, r[6], r[7], r[8]) for g in groups if (r := _row(h, device, g)) is not None]
    moved = [c for c in checks if c[1] > 1 / K + 1e-3]
    comparable = [c for c in checks if not (np.isnan(c[2]) or np.isnan(c[3]))]
    order = [c for c in comparable if c[2] > c[3] + 1e-4]
    return f.fill(block["summary"], label=label, inv_k=1 / K, moved=len(moved), groups=len(checks),
                  own=", ".join(f"{g} {o:.4f}" for g, o, _, _ in checks), order=len(order), comparable=len(comparable),
                  pairs=", ".join(f"{g} {hi:.4f} vs {lo:.4f}" for g, _, hi, lo in comparable))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


KINDS = {"coef_history": coef_history}
KEYS = {"runs", "file", "seed", "figure", "figure_dir", "missing", "devices", "device_item", "table_intro",
        "label_head", "panel_title"}
