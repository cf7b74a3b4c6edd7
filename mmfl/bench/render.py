"""Table cells, paired-comparison rows, markdown tables, plots and the report file, for the
table specs of ``benchmarks/<paper>/tables.py``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mmfl.sweep import paired_verdict, spread_text, verdict

PAIR_HEAD = ["| difference (points) | mean | 95% bootstrap CI | paired t p | claim |", "|---|---|---|---|---|"]
MIN_SEEDS_FOR_CLAIM = 5  # the project's rule: orderings from 5 paired seeds


def ms(vals: list[float], n_expected: int, digits: int = 1, scale: float = 1.0) -> str:
    """``"mean ± std"`` (population std) of ``vals`` x ``scale``; one value alone; ``"—"`` for
    none; ``" (n/N)"`` appended when fewer than ``n_expected`` values."""
    if not vals:
        return "—"
    v = [x * scale for x in vals]
    txt = f"{np.mean(v):.{digits}f} ± {np.std(v):.{digits}f}" if len(v) > 1 else f"{v[0]:.{digits}f}"
    return txt + ("" if len(v) == n_expected else f" ({len(v)}/{n_expected})")


def seed_cell(vals: dict[int, float | None], scale: float = 100.0, digits: int = 1) -> str:
    """``"mean ± std [n seeds]"`` over the seeds of ``vals`` (``{seed: value}``, ``None`` = a
    diverged run: reported as ``(k of n diverged)``, left out of the mean)."""
    ok = [v for v in vals.values() if v is not None]
    failed = sum(v is None for v in vals.values())
    txt = f"{scale * np.mean(ok):.{digits}f} ± {scale * np.std(ok):.{digits}f}" if ok else "–"
    return txt + (f" ({failed} of {len(vals)} diverged)" if failed else "") + \
        (f" [{len(ok)} seed{'s' * (len(ok) != 1)}]" if ok else "")


def paired(a: dict[int, float | None], b: dict[int, float | None], scale: float = 1.0,
           fail_value: float | None = None) -> dict:
    """:func:`mmfl.sweep.paired_verdict` of a − b over the seeds both have (``{seed: value}``),
    a ``None`` (diverged) value replaced by ``fail_value`` (or the seed dropped when that is
    None). Adds ``claim`` ("a > b" / "a < b" / "no ordering"), ``seeds`` and ``diverged``."""
    seeds = sorted(k for k in a if k in b)
    if fail_value is None:
        seeds = [k for k in seeds if a[k] is not None and b[k] is not None]
    div = sum(a[k] is None for k in seeds) + sum(b[k] is None for k in seeds)
    fill = lambda v: fail_value if v is None else v  # noqa: E731
    v = paired_verdict([scale * fill(a[k]) for k in seeds], [scale * fill(b[k]) for k in seeds])
    v["claim"] = {"holds": "a > b", "**reversed**": "a < b"}.get(v["word"], "no ordering")
    v["seeds"], v["diverged"] = seeds, div
    return v


def pair_row(label_a: str, label_b: str, a: dict, b: dict, scale: float = 100.0, fail_value: float | None = None,
             min_seeds: int = MIN_SEEDS_FOR_CLAIM, fail_note: str = "") -> str:
    """One row under :data:`PAIR_HEAD`: mean difference, bootstrap CI, paired t p and the
    claim (made only from ``min_seeds`` paired seeds). A diverged run counts as
    ``fail_value`` (in the values' unit; ``fail_note`` names it, e.g. "10%")."""
    seeds = sorted(k for k in a if k in b)
    if len(seeds) < 2:
        return f"| {label_a} − {label_b} | n/a ({len(seeds)} paired seed{'s' * (len(seeds) != 1)}) | | | |"
    r = paired(a, b, scale, fail_value)
    claim = {"a > b": f"**{label_a} > {label_b}**", "a < b": f"**{label_a} < {label_b}**"}.get(r["claim"], "no ordering")
    if r["n"] < min_seeds:
        claim = "not claimed"
    div = r["diverged"]
    note = f"; {div} diverged run{'s' * (div != 1)} counted as {fail_note}" if div else ""
    p = "–" if math.isnan(r["p"]) else f"{r['p']:.3f}"
    return (f"| {label_a} − {label_b} | {r['delta']:+.2f} | [{r['lo']:+.2f}, {r['hi']:+.2f}] | "
            f"{p} | {claim} ({r['n']} seeds{note}) |")


def verdict_cell(v: dict, digits: int = 1) -> str:
    """A :func:`paired_verdict` in one cell: ``"+1.2 [+0.3, +2.0], p 0.012: holds"`` (``"—"``
    under 2 pairs)."""
    if v["n"] < 2:
        return "—"
    return f"{v['delta']:+.{digits}f} [{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}], p {v['p']:.3f}: {v['word']}"


def verdict_count(verdicts: list[str], what: str) -> str:
    """One sentence counting :func:`mmfl.sweep.verdict` texts ("holds, beyond the spread", ...):
    how many of the ``what`` claims hold in the mean, beyond the seed spread, reversed beyond it."""
    held = sum(v.startswith("holds") for v in verdicts)
    if any(v.endswith("(1 seed)") for v in verdicts):
        return f"{held} of {len(verdicts)} {what} claims hold (one seed: no spread to judge them by)."
    beyond = sum(v.startswith("holds, beyond") for v in verdicts)
    rev = sum(v.startswith("**reversed**, beyond") for v in verdicts)
    return (f"{held} of {len(verdicts)} {what} claims hold in the mean; {beyond} beyond the seed spread, "
            f"{rev} reversed beyond it, the rest within it.")


SPREAD_RULE = ("Computed from the tables above: a claim 'a > b' *holds beyond the spread* when "
               "mean(a) − mean(b) > std(a) + std(b), *within the spread* when it is positive but smaller; "
               "likewise *reversed*.")  # how :func:`claim_row` verdicts read (mmfl.sweep.verdict)


def claim_row(text: str, a: list[float], b: list[float], scale: float = 100.0, digits: int = 1) -> tuple[str, float, str]:
    """A claim "a > b" over seeds (:func:`mmfl.sweep.verdict`) as a row under
    ``| claim | Δ | spread | here |``: ``(line, delta, verdict text)``."""
    d, sp, v = verdict(a, b, scale)
    return f"| {text} | {d:+.{digits}f} | {spread_text(sp, digits)} | {v} |", d, v


def claim_table(claims: list[tuple[str, list[float], list[float], float, int]], unit: str = "points",
                spread: str = "spread (std a + std b)", claim: str = "claim") -> tuple[list[str], list[str]]:
    """Claims ``(text, a, b, scale, digits)`` meaning a > b (those with values on both sides) as a
    markdown table ending with an empty line, and their verdicts; ``([], [])`` when none has."""
    lines = [f"| {claim} | Δ ({unit}) | {spread} | here |", "|---|---|---|---|"]
    verdicts = []
    for text, a, b, scale, digits in claims:
        if a and b:
            line, _, v = claim_row(text, a, b, scale, digits)
            lines.append(line)
            verdicts.append(v)
    return (lines + [""] if verdicts else []), verdicts


def md_table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table (lines)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(str(c) for c in r) + " |" for r in rows]]


def plot_series(series: dict[str, tuple[list, list]], path: str | Path, xlabel: str, ylabel: str,
                title: str | None = None, styles: dict[str, dict] | None = None) -> Path:
    """Lines ``{label: (xs, ys)}`` into a PNG (matplotlib, Agg); ``styles``: keyword
    arguments of ``plot`` per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, label=label, **(styles or {}).get(label, {"marker": "o", "markersize": 3}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(path: str | Path, lines: list[str], keep_below: str | None = None) -> Path:
    """Write ``"\\n".join(lines)``. ``keep_below``: a marker line; when the file already has
    it, the hand-written text below it is kept (``lines`` must end with the marker and an
    empty line, which are replaced by the marker, the kept text and an empty line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = list(lines)
    old = path.read_text() if path.is_file() else ""
    if keep_below and keep_below in old:
        lines[-2:] = [keep_below, old.split(keep_below, 1)[1].strip("\n"), ""]
    path.write_text("\n".join(lines))
    return path
