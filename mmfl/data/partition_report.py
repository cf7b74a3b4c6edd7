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


def partition_summary(counts, class_names=None, max_rows: int = 50) -> str:
    """A table (rows = clients, columns = classes + total) and a summary line.

    With more than ``max_rows`` clients only the first and last rows are shown.
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
    rows = [[str(i)] + [str(v) for v in c[i]] + [str(tot[i])] for i in range(n_cl)]
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
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    c = np.asarray(counts, dtype=np.int64)
    n_cl, k = c.shape
    names = _names(class_names, k)
    height = min(40.0, max(3.0, 0.25 * n_cl + 1.5))
    fig = Figure(figsize=(8, height))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
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
        ax.set_yticks(ypos)
    if title:
        ax.set_title(title)
    if k <= 20:
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", title="class")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path
