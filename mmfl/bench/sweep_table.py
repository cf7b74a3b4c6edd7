"""A sweep's results: mean ± std over seeds of each (setting, method) cell, as Markdown, CSV
and a plot of the main metric per round (mean with a ± std band). Read from the finished runs
of the grid's raw folder by :class:`mmfl.bench.Bench` (a run's final evaluated row)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from mmfl.bench.render import md_table, ms
from mmfl.bench.runner import Bench

# metrics a run may report, in the order the table shows them: key -> (label, scale for the table)
KNOWN = {"accuracy": ("final accuracy (%)", 100.0), "personal/accuracy": ("personalized accuracy (%)", 100.0),
         "uar": ("UAR (%)", 100.0), "r1_sum": ("R@1 sum (i2t + t2i, %)", 1.0)}


def metrics_of(b: Bench, chosen: list[str] | None = None) -> list[str]:
    """The metric keys of the table: ``chosen``, else those of :data:`KNOWN` that any finished run's
    final row has (the engine's global accuracy, a personalized or retrieval protocol's metric)."""
    if chosen:
        return list(chosen)
    names = b.finished()
    found = [k for k in KNOWN if any(b.results.final(n, k) is not None for n in names)]
    return found or ["accuracy"]


def cells(b: Bench, metrics: list[str]) -> list[dict]:
    """One dict per (group, setting, method) cell: labels, axis values, and per metric the seeds'
    values (``{seed: value}``), planned and failed counts."""
    out = []
    for gk, g in b.grid.groups.items():
        for sk, s in g.settings.items():
            for mk, m in {**g.methods, **g.extra}.items():
                names = b.names(gk, mk, sk)
                if not names:
                    continue
                c = {"group": gk, "setting": s.label, "method": m.label, "names": names,
                     "axes": {**s.info.get("axes", {}), **m.info.get("axes", {})},
                     "failed": sum(b.results.failed(n) is not None for n in names.values()), "values": {}}
                for key in metrics:
                    c["values"][key] = b.by_seed(gk, mk, sk, key=key)
                out.append(c)
    return out


def _fmt(c: dict, key: str) -> str:
    """A cell: mean ± std (n/N) of the metric, with how many of its runs failed."""
    txt = ms(list(c["values"][key].values()), len(c["names"]), digits=2, scale=KNOWN.get(key, ("", 1.0))[1])
    return txt + (f" [{c['failed']} failed]" if c["failed"] else "")


def markdown(b: Bench, cs: list[dict], metrics: list[str]) -> list[str]:
    """Lines: per group, one table per metric with settings as rows and methods as columns when
    both vary, else one table with the cells as rows and the metrics as columns."""
    out = []
    for gk in b.grid.groups:
        mine = [c for c in cs if c["group"] == gk]
        if len(b.grid.groups) > 1:
            out += [f"## {b.grid.groups[gk].label}", ""]
        settings = list(dict.fromkeys(c["setting"] for c in mine))
        methods = list(dict.fromkeys(c["method"] for c in mine))
        if len(settings) > 1 and len(methods) > 1:
            for key in metrics:
                out += [f"{KNOWN.get(key, (key,))[0]}, mean ± std over seeds:", ""]
                rows = []
                for s in settings:
                    by_m = {c["method"]: c for c in mine if c["setting"] == s}
                    rows.append([s, *[_fmt(by_m[m], key) if m in by_m else ""
                                      for m in methods]])
                out += [*md_table(["setting", *methods], rows), ""]
        else:
            head = [h for h, many in (("setting", len(settings) > 1), ("method", len(methods) > 1)) if many] or ["run"]
            rows = [[*([c["setting"]] if len(settings) > 1 else []), *([c["method"]] if len(methods) > 1 else []),
                     *([] if len(settings) > 1 or len(methods) > 1 else [c["method"]]),
                     *[_fmt(c, k) for k in metrics]] for c in mine]
            out += [*md_table([*head, *[f"{KNOWN.get(k, (k,))[0]}" for k in metrics]], rows), ""]
    n_seeds = max((len(c["names"]) for c in cs), default=0)
    out.append(f"Mean ± std (population std) over {n_seeds} seed{'s' * (n_seeds != 1)} of each cell's final "
               "evaluated row; (n/N): only n of the N planned runs finished.")
    return out


def write_csv(path: Path, cs: list[dict], metrics: list[str]) -> Path:
    """The cells as a tidy CSV: one row per cell and metric (mean, std, n, planned, failed, the
    seeds' values), with a column per axis."""
    axes = list(dict.fromkeys(k for c in cs for k in c["axes"]))
    groups = len({c["group"] for c in cs}) > 1
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*(["group"] if groups else []), "setting", "method", *axes, "metric", "mean", "std", "n",
                    "planned", "failed", "values"])
        for c in cs:
            for key in metrics:
                v = list(c["values"][key].values())
                w.writerow([*([c["group"]] if groups else []), c["setting"], c["method"],
                            *[c["axes"].get(a, "") for a in axes], key,
                            repr(float(np.mean(v))) if v else "", repr(float(np.std(v))) if v else "",
                            len(v), len(c["names"]), c["failed"], " ".join(repr(x) for x in v)])
    return path


def curve(b: Bench, names: list[str], key: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Rounds, mean and std over the finished runs of ``names`` of each evaluated row's ``key``
    (as long as the shortest run)."""
    rows = [[r for r in b.results.rows(n) if key in r] for n in names if b.results.finished(n)]
    rows = [r for r in rows if r]
    if not rows:
        return [], np.array([]), np.array([])
    k = min(len(r) for r in rows)
    vals = np.array([[r[i][key] for i in range(k)] for r in rows], dtype=float)
    return [int(rows[0][i].get("round", i + 1)) for i in range(k)], vals.mean(0), vals.std(0)


def plot(b: Bench, cs: list[dict], key: str, path: Path) -> Path | None:
    """``key`` per round, one panel per setting, a line per method with a ± std band; None when
    no run has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = list(dict.fromkeys((c["group"], c["setting"]) for c in cs))
    series = {(c["group"], c["setting"], c["method"]): curve(b, list(c["names"].values()), key) for c in cs}
    if not any(xs for xs, _, _ in series.values()):
        return None
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False, sharey=True)
    label, scale = KNOWN.get(key, (key, 1.0))
    label = label.replace("final ", "")
    methods = list(dict.fromkeys(m for _, _, m in series))
    for ax, (gk, s) in zip(axes.flat, panels):
        for (g2, s2, m), (xs, mean, std) in series.items():
            if (g2, s2) != (gk, s) or not xs:
                continue
            i = methods.index(m)  # a style per method, so that equal curves stay visible
            line, = ax.plot(xs, mean * scale, linestyle=("-", "--", "-.", ":")[i % 4], label=m,
                            marker="osd^v<>"[i % 7] if len(xs) <= 30 else None, markersize=4, markerfacecolor="none")
            ax.fill_between(xs, (mean - std) * scale, (mean + std) * scale, color=line.get_color(), alpha=0.2)
        ax.set_title(s or b.grid.name, fontsize=9)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no finished run", ha="center", va="center", transform=ax.transAxes)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(label)
    fig.suptitle(f"{b.grid.name}: {label} per round (mean ± std over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
