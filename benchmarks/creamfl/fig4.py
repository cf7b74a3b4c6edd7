"""CreamFL benchmark, Figure 4 (bytes vs R@1_sum): its points over seeds and the plot (a sibling of
tables.py, loaded with ``load_sibling``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmfl.bench import md_table

KEY = "rsum_authors"  # the paper's R@1_sum (tables.py)
STYLES = {"CreamFL (vary num)": ("tab:blue", "-", "o"), "CreamFL (vary d)": ("tab:orange", "-", "s"),
          "reamFL+IoT (vary num)": ("tab:blue", "--", "o"), "reamFL+IoT (vary d)": ("tab:orange", "--", "s"),
          "FedAvg (vary server size)": ("tab:red", ":", "^"), "FedIoT (vary server size)": ("tab:purple", ":", "v")}


def fig4_series(b, st) -> dict[str, list[tuple]]:
    """Figure 4's points over seeds: ``{series: [(label, MB/round, mean R@1_sum, std, total MB, n)]}``."""
    series: dict[str, list[tuple]] = {}
    for m, e in b.methods("fig4").items():
        if e.settings is not None and st not in e.settings:
            continue
        rows = [r for r in (b.results.final(x, KEY) for x in b.names("fig4", m, st).values()) if r is not None]
        if rows:
            y = [r[KEY] for r in rows]
            series.setdefault(e.info["series"], []).append(
                (e.label, float(np.mean([r["_mb_round"] for r in rows])), float(np.mean(y)), float(np.std(y)),
                 float(np.mean([r["_mb_total"] for r in rows])), len(rows)))
    return series


def fig4(b, out_png: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    lines = []
    settings = [st for st in b.grid.settings("fig4") if fig4_series(b, st)]
    if not settings:
        return ["Not run in this regeneration (no finished Figure 4 run; the command above runs it).", ""]
    fig, axes = plt.subplots(1, len(settings), figsize=(6.2 * len(settings), 4.4), squeeze=False)
    for ax, st in zip(axes[0], settings):
        lines += [f"### {st}, mean ± std over seeds {b.grid.groups['fig4'].seeds} (descriptive: no ordering is "
                  "claimed from Figure 4)", "",
                  *md_table(["series", "point", "MB / round (up + down)", "total MB", "R@1_sum", "seeds"], [])]
        series = fig4_series(b, st)
        labels: dict[tuple, list[str]] = {}  # one annotation per point (num=all and d=default coincide)
        for ser, pts in series.items():
            for lab, mb, y, sd, total, n in pts:
                lines.append(f"| {ser} | {lab} | {mb:.2f} | {total:.1f} | {y:.1f} ± {sd:.1f} | {n} |")
            color, ls, mk = STYLES.get(ser, ("k", "-", "o"))
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
        ax.set_ylabel("R@1_sum (fifths + all, i2t + t2i, %), mean ± std")
        ax.set_title(f"{st}: communication vs performance (Fig. 4 analog)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        if series:
            ax.legend(fontsize=7)
        lines.append("")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return lines
