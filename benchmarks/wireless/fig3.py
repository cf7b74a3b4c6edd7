"""Fig. 3 of the wireless benchmark: the aggregation coefficients xi~ of one device over the
rounds, from the Xi history its runs keep (``xi_history.json``, written post-run from the kept
checkpoints by :func:`xi_history`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mmfl.bench import load_sibling

_r = load_sibling(__file__, "readings")
PAPER_ETA, make_run = _r.PAPER_ETA, _r.make_run


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
