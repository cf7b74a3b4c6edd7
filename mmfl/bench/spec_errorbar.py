"""The ``errorbar_figure`` block kind of a TOML table spec (:mod:`mmfl.bench.spec`): points of
series over seeds (each method of a group is a point of the series ``info.series``), drawn as
error bars, one panel per setting, and listed in a table per setting; or (``mode = "lines"``) one
sentence per series at the block's setting. Format: docs/benchmarks.md "Table specs"."""

from __future__ import annotations

import numpy as np

from mmfl.bench.render import md_table
from mmfl.bench.spec_values import _fields


def points(b, block: dict, setting: str) -> dict[str, list[dict]]:
    """``{series: [{label, x, y, sd, n, <means>}]}``: per method of ``group`` planned at ``setting``
    with finished runs, the means over seeds of ``x`` and of each ``means`` key, and the mean and
    std of ``metric.key`` (all read off the runs' final rows)."""
    g, key = block["group"], block["metric"]["key"]
    out: dict[str, list[dict]] = {}
    for m, e in b.methods(g).items():
        if e.settings is not None and setting not in e.settings:
            continue
        rows = [r for r in (b.results.final(x, key) for x in b.names(g, m, setting).values()) if r is not None]
        if rows:
            y = [r[key] for r in rows]
            p = {"label": e.label, "y": float(np.mean(y)), "sd": float(np.std(y)), "n": len(rows),
                 "x": float(np.mean([r[block["x"]] for r in rows]))}
            p.update({k: float(np.mean([r[v] for r in rows])) for k, v in block.get("means", {}).items()})
            out.setdefault(e.info["series"], []).append(p)
    return out


def errorbar_figure(b, block: dict, f) -> list[str]:
    """Keys: ``group``, ``metric.key`` (y), ``x`` (a key of the final row, log scale), ``means``
    (more per-point means for the table), ``file`` (the PNG, relative to the report), ``link``,
    ``heading`` / ``header`` / ``line`` (each setting's table: fields of a point and ``{series}``),
    ``xlabel`` / ``ylabel`` / ``title``, ``styles = { series = [colour, linestyle, marker] }``
    (dashed: hollow markers), ``annotate_replace`` ([[old, new], ...] in the point labels),
    ``panel`` ([width, height] inches), ``dpi``, ``empty``. ``mode = "lines"``: ``line`` per series
    of at least ``min_points`` points, ``{points}`` joined ``point`` templates."""
    if block.get("mode") == "lines":
        out = []
        for ser, pts in points(b, block, block.get("setting")).items():
            if len(pts) >= block.get("min_points", 2):
                out.append(f.fill(block["line"], series=ser,
                                  points=", ".join(f.fill(block["point"], **p) for p in pts)))
        return out
    settings = [st for st in b.grid.settings(block["group"]) if points(b, block, st)]
    if not settings:
        return f.fill(block["empty"]).split("\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    w, h = block.get("panel", [6.2, 4.4])
    fig, axes = plt.subplots(1, len(settings), figsize=(w * len(settings), h), squeeze=False)
    lines = []
    for ax, st in zip(axes[0], settings):
        g = _fields(b, f, st)
        lines += [*g.fill(block["heading"]).split("\n"), *md_table([g.fill(x) for x in block["header"]], [])]
        series = points(b, block, st)
        labels: dict[tuple, list[str]] = {}  # one annotation per point (coinciding points share it)
        for ser, pts in series.items():
            lines += [g.fill(block["line"], series=ser, **p) for p in pts]
            color, ls, mk = block.get("styles", {}).get(ser, ("k", "-", "o"))
            pts = sorted(pts, key=lambda p: p["x"])
            ax.errorbar([p["x"] for p in pts], [p["y"] for p in pts], yerr=[p["sd"] for p in pts], color=color,
                        linestyle=ls, marker=mk, label=ser, capsize=2, markerfacecolor="none" if ls == "--" else color)
            for p in pts:
                lab = p["label"]
                for old, new in block.get("annotate_replace", []):
                    lab = lab.replace(old, new)
                here = labels.setdefault((round(p["x"], 6), round(p["y"], 6)), [])
                if lab not in here:
                    here.append(lab)
        for (x, y), labs in labels.items():
            ax.annotate(" / ".join(labs), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel(g.fill(block["xlabel"]))
        ax.set_ylabel(g.fill(block["ylabel"]))
        ax.set_title(g.fill(block["title"]), fontsize=10)
        ax.grid(alpha=0.3, which="both")
        if series:
            ax.legend(fontsize=7)
        lines.append("")
    fig.tight_layout()
    png = b.grid.report.parent / f.fill(block["file"])
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=block.get("dpi", 120))
    plt.close(fig)
    return [*f.fill(block["link"], file=f.fill(block["file"])).split("\n"), *lines[:-1]]


KINDS = {"errorbar_figure": errorbar_figure}
KEYS = {"x", "means", "file", "link", "heading", "xlabel", "ylabel", "title", "styles", "annotate_replace",
        "panel", "dpi", "mode", "point", "min_points", "empty"}
