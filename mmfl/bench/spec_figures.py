"""Figure kinds of a TOML table spec (:mod:`mmfl.bench.spec`): each draws a PNG next to the
report (``figure``: its file name, a template) from the finished runs and returns its markdown link
(with ``title``: the title line, an empty line, the link; no link when nothing was drawn).

- ``sweep_figure``: a panel per split of :func:`mmfl.bench.spec_sweeps.axes` (the ``sweep`` kind's
  settings), a line per method: x = the setting's ``info[x]`` x ``x_scale``, y = the mean over seeds of
  the metric, a failed run whose message says it diverged counted as ``fail_value``;
- ``xy_figure``: lines of methods grouped by an info key (``series = { info = "mode", lines = [[value,
  marker, label], ...] }``): x = a metric of the first seed (finite only), y = the mean over seeds of
  another; ``ref = { value, label }``: a dashed line at the mean of the methods with that info value;
- ``bar_figure``: grouped bars, a group per method, a bar per ``bars = [[key, label], ...]`` (the mean
  of the metric over seeds), or with ``list_key`` a bar per element of a list-valued metric (one series
  per method of ``methods``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mmfl.bench.spec_read import _key, _m, axes, diverged, list_means, lower_of


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(b, block: dict, f, fig, plt, dpi: int) -> str:
    name = f.fill(block["figure"])
    fig.tight_layout()
    fig.savefig(Path(b.grid.report or b.grid.raw_dir / "x").parent / name, dpi=block.get("dpi", dpi))
    plt.close(fig)
    return name


def _link(block: dict, f, name: str | None, alt: str) -> list[str]:
    head = [f.fill(block["title"])] if "title" in block else []
    if name is None:
        return head
    return head + ([""] if head else []) + [f"![{alt}]({name})"]


def _vals(b, g: str, method: str, setting: str | None, m: dict, info: dict) -> list[float]:
    vals = b.results.by_seed(b.names(g, method, setting), _key(m, info), m["reader"], m["keep_failed"],
                             m["eval_key"] or b.grid.eval_key)
    return [v for v in vals.values() if v is not None]


def sweep_figure(b, block: dict, f) -> list[str]:
    g, m = block["group"], _m(block.get("metric"), keep_failed=True)
    splits, base = axes(b, block)
    if not [s for s in splits.values() if s]:
        return _link(block, f, None, g)
    plt, x, xs_scale, cols = _plt(), block["x"], block.get("x_scale", 100.0), block.get("panel_cols", 3)
    nrow = math.ceil(len(splits) / cols)
    fig, axs = plt.subplots(nrow, cols, figsize=(12, 3.4 * nrow), squeeze=False, sharey=True)
    drawn = False
    for ax, (split, settings) in zip(axs.flat, splits.items()):
        points = ([base] if base else []) + settings
        for mk, e in b.methods(g).items():
            xs, ys = [], []
            for s in points:
                v = _vals(b, g, mk, s, m, e.info) + [block["fail_value"] for n in b.names(g, mk, s).values()
                                                     if diverged(b, n, m["fail_words"])]
                if v:
                    xs.append(xs_scale * b.grid.settings(g)[s].info[x])
                    ys.append(m["scale"] * float(np.mean(v)))
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=e.label)
                drawn = True
        ax.set_title(split)
        ax.set_xticks([round(xs_scale * b.grid.settings(g)[s].info[x]) for s in points])
        ax.set_xlabel(f.fill(block["xlabel"]))
        ax.grid(alpha=0.3)
    for ax in axs[:, 0]:
        ax.set_ylabel(f.fill(block["ylabel"]))
    for ax in list(axs.flat)[len(splits):]:
        ax.axis("off")
    if drawn:
        axs.flat[0].legend(fontsize=7)
    fig.suptitle(b.grid.groups[g].label)
    name = _save(b, block, f, fig, plt, 100)
    return _link(block, f, name if drawn else None, g)


def xy_figure(b, block: dict, f) -> list[str]:
    g, setting = block["group"], block.get("setting")
    mx, my = _m(block["x"], agg="first"), _m(block["metric"])
    plt = _plt()
    fig, ax = plt.subplots(figsize=tuple(block.get("size", (6.4, 4.2))))
    points = []  # (info, x of the first seed with a y, mean y)
    for mk, e in b.methods(g).items():
        names = {s: n for s, n in b.names(g, mk, setting).items() if b.results.finished(n)}
        ys = [v for n in names.values() if (v := b.results.value(n, my["key"], my["reader"])) is not None]
        xv = b.results.value(next(iter(names.values())), mx["key"], mx["reader"]) if names else None
        points.append((e.info, xv, my["scale"] * float(np.mean(ys)) if ys else None))
    key = block["series"]["info"]
    for val, marker, label in block["series"]["lines"]:
        pts = sorted((x, y) for info, x, y in points if info.get(key) == val and y is not None
                     and x is not None and math.isfinite(x))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
    ref = [y for info, _, y in points if "ref" in block and info.get(key) == block["ref"]["value"] and y is not None]
    if ref:
        ax.axhline(ref[-1], color="grey", ls="--", label=block["ref"]["label"])
    ax.set_xscale(block.get("xscale", "linear"))
    ax.set_xlabel(f.fill(block["xlabel"]))
    ax.set_ylabel(f.fill(block["ylabel"]))
    ax.set_title(f.fill(block["plot_title"]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _link(block, f, _save(b, block, f, fig, plt, 110), g)


def bar_figure(b, block: dict, f) -> list[str]:
    g, setting, w = block["group"], block.get("setting"), block.get("bar_width", 0.27)
    plt = _plt()
    fig, ax = plt.subplots(figsize=tuple(block.get("size", (6.4, 4.2))))
    lo = lower_of(b, block["lower"]) if "lower" in block else ""
    if "list_key" in block:  # a series per method, a bar per element
        for j, mk in enumerate(block["methods"]):
            pc = list_means(b, g, mk, setting, block["list_key"].format(lower=lo), block.get("scale", 100.0))
            if pc is not None:
                ax.bar(np.arange(len(pc)) + (j - (len(block["methods"]) - 1) / 2) * w, pc, width=w,
                       label=b.methods(g)[mk].label)
        ax.set_xlabel(f.fill(block["xlabel"]))
    else:  # a group per method, a bar per metric
        methods, bars = b.methods(g), block["bars"]
        xs = np.arange(len(methods))
        for j, (key, label) in enumerate(bars):
            m = _m({**block.get("metric", {}), "key": key})
            means = [np.mean(v) if (v := [m["scale"] * x for x in _vals(b, g, mk, setting, m, e.info)]) else np.nan
                     for mk, e in methods.items()]
            ax.bar(xs + (j - (len(bars) - 1) / 2) * w, means, width=w, label=f.fill(label))
        ax.set_xticks(xs, [e.label for e in methods.values()], rotation=block.get("xticks_rotation", 0))
    ax.set_ylabel(f.fill(block["ylabel"], lower=lo))
    ax.set_title(f.fill(block["plot_title"], lower=lo), **({"fontsize": block["fontsize"]} if "fontsize" in block else {}))
    ax.legend(**({"ncol": block["legend_cols"], "fontsize": 8} if "legend_cols" in block else {}))
    return _link(block, f, _save(b, block, f, fig, plt, 120), block.get("alt", g))


KINDS = {"sweep_figure": sweep_figure, "xy_figure": xy_figure, "bar_figure": bar_figure}
KEYS = {"figure", "series", "x_scale", "fail_value", "panel_cols", "xlabel", "ylabel", "xscale", "ref", "bars", "size",
        "dpi", "xticks_rotation", "legend_cols", "fontsize", "setting", "bar_width", "plot_title", "alt", "lower",
        "list_key", "methods"}
