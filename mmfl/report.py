"""Summaries, comparison tables and plots of finished runs.

Everything here is recomputed from a run folder's ``metrics.jsonl`` and
``config.toml``, so a table or plot can always be regenerated.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmfl.errors import MMFLError


RETRIEVAL_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "r1_sum", "rsum", "rsum_authors")


def load_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise MMFLError(f"{run_dir}: not a run folder (no metrics.jsonl)")
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines):  # torn by a crash mid-write; resume drops it too
                break
            raise MMFLError(f"{path}: line {i} is not valid JSON") from None
    return rows


def summarize(rows: list[dict], cfg=None) -> dict:
    """Final and best accuracy, total bytes and time of a run (and, for a run with a
    ``[system]`` model, its total simulated time ``sim_time_total_s``)."""
    evals = [r for r in rows if "accuracy" in r]
    out = {
        "rounds": len(rows),
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "best_accuracy": max(r["accuracy"] for r in evals) if evals else None,
        "bytes_up": sum(r.get("bytes_up", 0) for r in rows),
        "bytes_down": sum(r.get("bytes_down", 0) for r in rows),
        "wall_time_s": sum(r.get("wall_time_s", 0.0) for r in rows),
        "mean_round_time_s": (sum(r.get("train_time_s", 0.0) for r in rows) / len(rows)) if rows else None,
    }
    sims = [r["sim_time_s"] for r in rows if "sim_time_s" in r]  # a [system] run: simulated latency
    if sims:
        out["sim_time_total_s"] = sum(sims)
        out["mean_sim_round_s"] = sum(sims) / len(sims)
    dp = [r for r in rows if "dp/epsilon" in r]  # a [dp] run: the accountant's epsilon after the last round
    if dp:
        out["dp_epsilon"], out["dp_delta"] = dp[-1]["dp/epsilon"], dp[-1]["dp/delta"]
    if evals and "accuracy_std" in evals[-1]:
        out["final_accuracy_std"] = evals[-1]["accuracy_std"]
    if evals:  # a multimodal model's last evaluation: per-modality and class-wise numbers
        last = evals[-1]
        for key in sorted(last):
            if key.startswith(("accuracy/", "accuracy_top5", "uar", "class_accuracy", "pattern/")):
                out[f"final_{key}"] = last[key]
    retrieval = [r for r in rows if "r1_sum" in r]  # a retrieval model (CreamFL's server)
    if retrieval:
        last = retrieval[-1]
        for key in RETRIEVAL_KEYS:
            if key in last:
                out[f"final_{key}"] = last[key]
        out["best_r1_sum"] = max(r["r1_sum"] for r in retrieval)
    if cfg is not None:
        out["algorithm"] = cfg.algorithm.name
        out["data"] = cfg.data.name
        out["name"] = cfg.run.name
    return out


def rounds_to_reach(rows: list[dict], target: float) -> int | None:
    """First round whose test accuracy is >= target (MOON Table 2), else None."""
    for r in rows:
        if r.get("accuracy") is not None and r["accuracy"] >= target:
            return int(r["round"])
    return None


# what a run's ``accuracy`` is (:mod:`mmfl.core.evaluation`): the server model on the shared test
# set, the mean over clients of their personalized models (a ``personalized`` evaluation reports
# ``personal_test_rows``), or the mean of the clients' own models on their test sets (``clients``)
ACCURACY_KINDS = {"global": "test accuracy",
                  "personalized": "personalized mean accuracy (clients' models, own test rows)",
                  "clients": "mean accuracy of the clients' own models"}
SHORT_KIND = {"global": "test", "personalized": "personalized mean", "clients": "clients' mean"}
R1_LABEL = "R@1 sum (i2t + t2i, %)"
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "v", "D", "x", "+", "*")


def accuracy_kind(rows: list[dict]) -> str:
    """``global``, ``personalized`` or ``clients``: what the rows' ``accuracy`` means."""
    evals = [r for r in rows if "accuracy" in r]
    if any("personal_test_rows" in r for r in evals):
        return "personalized"
    if any("client_accuracy" in r and "accuracy_std" in r for r in evals):
        return "clients"
    return "global"


def _curves(rows: list[dict]) -> list[tuple[str, str, list]]:
    """A run's curves: (panel metric, kind, [(round, value)]); the personalized mean of
    ``run.personal_eval`` (``personal/accuracy``) is a second accuracy curve."""
    out = []
    for metric, kind in (("accuracy", accuracy_kind(rows)), ("personal/accuracy", "personalized"),
                         ("r1_sum", "r1")):
        pts = [(int(r["round"]), float(r[metric])) for r in rows if r.get(metric) is not None and "round" in r]
        if pts:
            out.append(("r1_sum" if metric == "r1_sum" else "accuracy", kind, pts))
    return out


def accuracy_figure(runs: dict[str, list[dict]], data: str | None = None):
    """The figure of ``mmfl report --plot``: one panel per metric the runs have (accuracy, else or
    also a retrieval model's R@1 sum), rounds on an integer axis, every curve its own line style
    and marker, a curve equal to an earlier one labelled "(same as <run>)", each panel titled.
    Returns ``(figure, notes)``: ``notes`` has one line per run that could not be drawn, saying why.
    Uses the Agg canvas directly (no pyplot, no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels: dict[str, list[tuple[str, str, list]]] = {}
    notes = []
    for name, rows in runs.items():
        curves = _curves(rows)
        if not curves:
            why = "no rows" if not rows else f"none of its {len(rows)} rows has accuracy or r1_sum " \
                                              "(no evaluated round: eval_every > rounds?)"
            notes.append(f"not plotted: {name}: {why}")
        for metric, kind, pts in curves:
            panels.setdefault(metric, []).append((name, kind, pts))
    order = [m for m in ("accuracy", "r1_sum") if m in panels]
    fig = Figure(figsize=(6.5, 4 * max(1, len(order))))
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(order)), 1, squeeze=False)[:, 0]
    where = f" ({data})" if data else ""
    if not order:
        axes[0].set_title(f"no evaluated rounds to plot{where}")
    i = 0
    for ax, metric in zip(axes, order):
        kinds = {kind for _, kind, _ in panels[metric]}
        mixed = metric == "accuracy" and len(kinds) > 1
        ylabel = R1_LABEL if metric == "r1_sum" else "accuracy" if mixed else ACCURACY_KINDS[kinds.pop()]
        seen: dict[tuple, str] = {}
        for name, kind, pts in panels[metric]:
            label = f"{name} ({SHORT_KIND[kind]})" if mixed else name
            key = tuple(pts)
            if key in seen:  # drawn exactly on top of another: say so
                label += f" (same as {seen[key]})"
            else:
                seen[key] = name
            ax.plot(*zip(*pts), linestyle=STYLES[i % len(STYLES)], marker=MARKERS[i % len(MARKERS)],
                    markevery=max(1, len(pts) // 30), markersize=5, label=label)
            i += 1
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} per round{where}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, notes


def plot_accuracy(runs: dict[str, list[dict]], path: str | Path, data: str | None = None) -> list[str]:
    """Write :func:`accuracy_figure` to ``path``; returns its notes (runs not drawn, and why)."""
    fig, notes = accuracy_figure(runs, data)
    fig.savefig(path, dpi=120)
    return notes


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


def _final_eval(rows: list[dict]) -> dict:
    evals = [r for r in rows if "accuracy" in r or "r1_sum" in r]
    return evals[-1] if evals else {}


def modality_columns(final_rows: list[dict]) -> list[str]:
    """The modalities with an ``accuracy/<m>`` metric in any of the rows, in first-seen order."""
    mods: list[str] = []
    for r in final_rows:
        for k in r:
            if k.startswith("accuracy/") and k[len("accuracy/"):] not in mods:
                mods.append(k[len("accuracy/"):])
    return mods


def pattern_columns(final_rows: list[dict]) -> list[str]:
    """The missingness patterns with a ``pattern/<name>/accuracy`` metric in any of the rows
    (a test set whose rows lack modalities, :mod:`mmfl.core.patterns`): ``complete`` first."""
    names: list[str] = []
    for r in final_rows:
        for k in r:
            if k.startswith("pattern/") and k.endswith("/accuracy") and k[8:-9] not in names:
                names.append(k[8:-9])
    return sorted(names, key=lambda n: (n != "complete", n.count("+"), n))


def compare(run_dirs: list[str | Path], plot_path: str | Path | None = None) -> str:
    """A Markdown table comparing runs (and an accuracy plot if ``plot_path``, followed by a
    ``not plotted: <run>: <why>`` line for each run the plot could not show).

    When a run has per-modality metrics (a multimodal model), the table adds the
    final ``acc/<m>`` of each modality's own head and the joint output's ``UAR``
    (unweighted average recall); a run without one shows ``-``."""
    import tomllib

    runs, datas = [], []
    for d in run_dirs:
        d = Path(d)
        rows = load_metrics(d)
        cfg_path = d / "config.toml"
        raw = tomllib.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        algo = raw.get("algorithm", {}).get("name", "?")
        data = raw.get("data", {}).get("name")
        if data and data not in datas:
            datas.append(data)
        runs.append((d, algo, rows))
    finals = [_final_eval(rows) for _, _, rows in runs]
    mods = modality_columns(finals)
    multimodal = bool(mods) or any("uar" in f for f in finals)
    patterns = pattern_columns(finals)  # accuracy by missingness pattern, where a run has it
    extra = [f"acc/{m}" for m in mods] + (["UAR"] if multimodal else []) + [f"acc {n}" for n in patterns]
    retrieval = any("r1_sum" in f for f in finals)  # server retrieval (CreamFL): Recall@1 both ways, R@1 sum
    authors = any("rsum_authors" in f for f in finals)
    if retrieval:
        extra += ["i2t R@1", "t2i R@1", "R@1 sum"] + (["rsum (authors)"] if authors else [])
    sim = any("sim_time_s" in r for _, _, rows in runs for r in rows)  # a [system] model's simulated time
    dp = any("dp/epsilon" in r for _, _, rows in runs for r in rows)  # a [dp] run: epsilon (delta) at the end
    cols = ["run", "algorithm", "rounds", "final acc", "best acc", *extra, "bytes up", "bytes down", "s/round",
            *(["sim time (s)"] if sim else []), *(["epsilon (delta)"] if dp else [])]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    fmt = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    curves = {}
    names = [d.name for d, _, _ in runs]
    for (d, algo, rows), final in zip(runs, finals):
        s = summarize(rows)
        cells = [d.name, algo, str(s["rounds"]), fmt(s["final_accuracy"]), fmt(s["best_accuracy"])]
        cells += [fmt(final.get(f"accuracy/{m}")) for m in mods]
        if multimodal:
            cells.append(fmt(final.get("uar")))
        cells += [fmt(final.get(f"pattern/{n}/accuracy")) for n in patterns]
        if retrieval:
            keys = ["i2t_r1", "t2i_r1", "r1_sum"] + (["rsum_authors"] if authors else [])
            cells += ["-" if final.get(k) is None else f"{final[k]:.2f}" for k in keys]
        cells += [_human_bytes(s["bytes_up"]), _human_bytes(s["bytes_down"]), f"{s['mean_round_time_s'] or 0:.2f}"]
        if sim:
            cells.append(f"{s['sim_time_total_s']:.4g}" if "sim_time_total_s" in s else "-")
        if dp:
            cells.append(f"{s['dp_epsilon']:.3g} ({s['dp_delta']:.0e})" if "dp_epsilon" in s else "-")
        lines.append("| " + " | ".join(cells) + " |")
        # two runs of one name (e.g. seeds in sibling folders) keep both curves
        label = d.name if names.count(d.name) == 1 else f"{d.parent.name}/{d.name}"
        curves[label if label not in curves else f"{label} [{len(curves)}]"] = rows
    if plot_path is not None:
        lines += plot_accuracy(curves, plot_path, ", ".join(datas) or None)
    for d, _, _ in runs:  # mmfl run --reference: each run's references under the table
        table = reference_table(d)
        if table is not None:
            lines += ["", table]
    return "\n".join(lines)


def final_best(rows: list[dict], key: str, uar: bool = True) -> dict:
    """``{"final", "best"}`` of metric ``key`` over the rows that have it (None without any), and
    ``"uar"``: the last such row's UAR where ``key`` is ``accuracy``, ``uar`` and the row has one."""
    evals = [r for r in rows if r.get(key) is not None]
    out = {"final": evals[-1][key] if evals else None, "best": max(r[key] for r in evals) if evals else None}
    if uar and evals and key == "accuracy" and evals[-1].get("uar") is not None:
        out["uar"] = evals[-1]["uar"]
    return out


def reference_rows(run_dir: str | Path) -> list[dict] | None:
    """A run's references (``<run>/reference/summary.json``, written by :mod:`mmfl.reference`) under
    its own result: dicts of ``method``, ``metric``, ``final``, ``best``, ``uar``, ``note``, the
    federated run first (read from its ``metrics.jsonl``); None: the run has no references."""
    path = Path(run_dir) / "reference" / "summary.json"
    if not path.is_file():
        return None
    try:
        ref = json.loads(path.read_text())
        key = ref["metric"]
    except (ValueError, KeyError):
        raise MMFLError(f"{path}: not a reference summary written by mmfl run --reference") from None
    fed = {"method": ref["federated"]["method"], **final_best(load_metrics(run_dir), key), "note": ""}
    cols = ("method", "final", "best", "uar", "note")
    return [{"metric": ref["metric_label"], **{c: r.get(c) for c in cols}} for r in [fed, *ref["rows"]]]


def reference_table(run_dir: str | Path) -> str | None:
    """:func:`reference_rows` as text: a heading naming the metric and the caveat, one line per
    method (the federated result on top); None: the run has no references."""
    rows = reference_rows(run_dir)
    if rows is None:
        return None
    r1 = rows[0]["metric"].startswith("R@1")
    fmt = lambda v: "-" if v is None else f"{v:.2f}" if r1 else f"{100 * v:.2f}%"  # noqa: E731
    uar = not r1 and rows[0]["uar"] is not None  # UAR where the run reports it
    width = max(len(r["method"]) for r in rows)
    lines = [f"{Path(run_dir).name}: references (pooled data, simulation only); metric: {rows[0]['metric']}",
             f"  {'method':<{width}}  {'final':>8}  {'best':>8}" + (f"  {'UAR':>8}" if uar else "")]
    for r in rows:
        if r["final"] is None and r["best"] is None and r.get("note"):  # no number: say why instead
            lines.append(f"  {r['method']:<{width}}  {r['note']}")
            continue
        line = f"  {r['method']:<{width}}  {fmt(r['final']):>8}  {fmt(r['best']):>8}"
        if uar:
            line += f"  {fmt(r['uar']):>8}"
        lines.append(line + (f"  ({r['note']})" if r.get("note") else ""))
    return "\n".join(lines)
