"""Readable views of a partition: a count table, a skew number, a bar chart.

``counts`` is always a ``[num_clients, num_classes]`` integer matrix of label
counts, e.g. :meth:`mmfl.data.Federation.class_counts` or
:func:`partition_counts`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def partition_counts(labels, parts: Sequence[np.ndarray], classes=None) -> np.ndarray:
    """``[len(parts), K]`` label counts of a partition of ``labels``.

    ``classes`` (the column order) defaults to ``np.unique(labels)``.
    """
    y = np.asarray(labels).reshape(-1)
    classes = np.unique(y) if classes is None else np.asarray(classes)
    out = np.zeros((len(parts), len(classes)), dtype=np.int64)
    for i, p in enumerate(parts):
        yi = y[np.asarray(p, dtype=np.int64)]
        pos = np.searchsorted(classes, yi)
        out[i] = np.bincount(pos, minlength=len(classes))[: len(classes)]
    return out


def skew(counts) -> float:
    """Mean over non-empty clients of the share of their largest class.

    1/K for perfectly balanced labels, 1.0 when each client holds one class;
    NaN if every client is empty.
    """
    c = np.asarray(counts, dtype=np.float64)
    tot = c.sum(axis=1)
    ok = tot > 0
    if not ok.any():
        return float("nan")
    return float((c[ok].max(axis=1) / tot[ok]).mean())


def label_entropy(counts) -> float:
    """Mean over non-empty clients of the entropy (bits) of their label distribution."""
    c = np.asarray(counts, dtype=np.float64)
    tot = c.sum(axis=1)
    ok = tot > 0
    if not ok.any():
        return float("nan")
    p = c[ok] / tot[ok, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log2(p), 0.0).sum(axis=1)
    return float(h.mean())


def _names(class_names, k: int) -> list[str]:
    names = [str(n) for n in (class_names or [])][:k]
    return names + [str(j) for j in range(len(names), k)]


def partition_summary(counts, class_names=None, max_rows: int = 50, client_ids=None) -> str:
    """A table (rows = clients, columns = classes + total) and a summary line.

    ``client_ids`` labels the rows (default 0..n-1). With more than ``max_rows`` clients only
    the first and last rows are shown.
    The last line gives min / mean / max client size, the mean per-client label
    entropy (bits; log2 K = balanced) and the mean largest-class share.
    """
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 2:
        raise ValueError(f"counts must be [num_clients, num_classes], got shape {c.shape}")
    n_cl, k = c.shape
    names = _names(class_names, k)
    tot = c.sum(axis=1)
    header = ["client"] + names + ["total"]
    ids = list(range(n_cl)) if client_ids is None else list(client_ids)
    rows = [[str(ids[i])] + [str(v) for v in c[i]] + [str(tot[i])] for i in range(n_cl)]
    if n_cl > max_rows:
        half = max_rows // 2
        rows = rows[:half] + [["..."] * len(header)] + rows[n_cl - (max_rows - half):]
    rows.append(["all"] + [str(v) for v in c.sum(axis=0)] + [str(tot.sum())])
    widths = [max(len(r[j]) for r in [header] + rows) for j in range(len(header))]

    def fmt(r):
        return "  ".join(s.rjust(w) for s, w in zip(r, widths))

    lines = [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]
    if n_cl:
        lines.append(
            f"{n_cl} clients, {k} classes; size min {tot.min()}, mean {tot.mean():.1f}, max {tot.max()}; "
            f"mean label entropy {label_entropy(c):.3f} bits (balanced {np.log2(max(k, 1)):.3f}); "
            f"mean max-class share {skew(c):.3f}")
    else:
        lines.append("0 clients")
    return "\n".join(lines)


def plot_partition(counts, path, class_names=None, title: str | None = None) -> Path:
    """Stacked horizontal bars of class counts per client, saved as a PNG at ``path``.

    Uses the Agg canvas directly (no pyplot, no global backend change).
    """
    return plot_groups([(counts, class_names, None, title)], path)


def plot_groups(groups, path, suptitle: str | None = None, strips=None) -> Path:
    """:func:`plot_partition` of several groups of clients, one panel each (e.g. ``[data]``'s
    clients and each ``[[client_data]]`` set's, every panel with its own classes). ``groups``:
    ``(counts, class_names, client_ids or None, title)`` tuples. ``strips`` (optional, one per
    group): ``(matrix, modality names)``, drawn left of the bars as a client x modality grid
    (the share of the client's rows holding the modality; blank: it does not hold it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    heights = [min(40.0, max(3.0, 0.25 * np.asarray(g[0]).shape[0] + 1.5)) for g in groups]
    fig = Figure(figsize=(8 + (1.5 if strips else 0), min(60.0, sum(heights))))
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(groups), 2 if strips else 1, squeeze=False,
                        gridspec_kw={"height_ratios": heights, **({"width_ratios": [1.3, 6]} if strips else {})})
    axes = grid[:, -1]
    for i, (ax, (counts, class_names, ids, title)) in enumerate(zip(axes, groups)):
        _bars(ax, counts, class_names, ids, title)
        if strips:
            _strip(grid[i, 0], *strips[i])
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def _bars(ax, counts, class_names, client_ids, title) -> None:
    import matplotlib

    c = np.asarray(counts, dtype=np.int64)
    n_cl, k = c.shape
    names = _names(class_names, k)
    colors = matplotlib.colormaps["tab20" if k > 10 else "tab10"]
    left = np.zeros(n_cl)
    ypos = np.arange(n_cl)
    for j in range(k):
        ax.barh(ypos, c[:, j], left=left, color=colors(j % colors.N), label=names[j],
                height=0.8, linewidth=0)
        left += c[:, j]
    ax.set_xlim(0, max(1.0, float(left.max(initial=0)) * 1.02))
    ax.set_ylabel("client")
    ax.set_xlabel("samples")
    ax.invert_yaxis()
    if n_cl <= 50:
        ax.set_yticks(ypos, [str(i) for i in (range(n_cl) if client_ids is None else client_ids)])
    if title:
        ax.set_title(title)
    if k <= 20:
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", title="class")


def _strip(ax, matrix, names) -> None:
    """Client x modality grid: green by the share of the client's rows holding the modality
    (its percentage written in), blank with a dash where the client does not hold it."""
    m = np.ma.masked_invalid(np.asarray(matrix, dtype=float))
    import matplotlib

    cmap = matplotlib.colormaps["Greens"].with_extremes(bad="white")
    ax.imshow(m, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    n, k = m.shape
    if n <= 50:
        for i in range(n):
            for j in range(k):
                v = matrix[i][j]
                ax.text(j, i, "-" if v != v else f"{100 * v:.0f}", ha="center", va="center", fontsize="x-small",
                        color="white" if v == v and v > 0.6 else "black")
    ax.set_xticks(range(k), list(names), rotation=45, ha="right", fontsize="small")
    ax.set_yticks([])
    ax.set_title("% rows with", fontsize="small")


def source_groups(fed, cfg) -> list[dict]:
    """The federation's clients by where their data comes from: ``[data]``'s, then each
    ``[[client_data]]`` entry's. Each group: ``title`` (data set, partition, client ids),
    ``ids``, ``counts`` (``[len(ids), K]`` over that data set's own classes) and ``class_names``."""
    out = []
    for src in [None] + list(range(len(cfg.client_data))):
        ids = [c for c in range(fed.num_clients) if fed.source_of(c) == src]
        if not ids:
            continue
        meta = fed.meta_of(ids[0])
        k = meta.num_classes
        counts = np.stack([np.bincount(fed.clients[c].label_array(), minlength=k)[:k] for c in ids])
        entry = cfg if src is None else cfg.client_data[src]
        where = "" if src is None else f"client_data[{src}] "
        span = f"client {ids[0]}" if len(ids) == 1 else f"clients {ids[0]}-{ids[-1]}"
        out.append({"title": f"{where}{entry.data.name}: {entry.partition.name} partition, {span}",
                    "ids": ids, "counts": counts, "class_names": list(meta.class_names)})
    return out


def federation_summary(fed, cfg) -> str:
    """:func:`partition_summary` of each group of :func:`source_groups`, each with its own
    data set's class names, under a line naming the data set, partition and client ids."""
    groups = source_groups(fed, cfg)
    if len(groups) == 1:
        g = groups[0]
        return (f"{cfg.data.name}: {cfg.partition.name} partition over {fed.num_clients} clients\n"
                + partition_summary(g["counts"], g["class_names"]))
    parts = [f"{fed.num_clients} clients from {len(groups)} data sets"]
    for g in groups:
        parts += ["", g["title"], partition_summary(g["counts"], g["class_names"], client_ids=g["ids"])]
    return "\n".join(parts)


def plot_federation(fed, cfg, path) -> Path:
    """:func:`plot_groups` of :func:`source_groups`: one panel per data set, titled; with
    several modalities or a simulation (:func:`~mmfl.data.simulation_report.simulation_active`),
    each client's modalities as a strip left of its bar."""
    from mmfl.data.simulation_report import simulation_active, strip_matrix

    groups = source_groups(fed, cfg)
    if len(groups) == 1:
        groups[0]["title"] = f"{cfg.data.name}: {cfg.partition.name} partition over {fed.num_clients} clients"
    strips = [strip_matrix(fed, g["ids"]) for g in groups] if simulation_active(fed, cfg) else None
    return plot_groups([(g["counts"], g["class_names"], g["ids"], g["title"]) for g in groups], path,
                       suptitle=f"{cfg.run.name}: class counts per client" if len(groups) > 1 else None,
                       strips=strips)
