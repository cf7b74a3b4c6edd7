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
            if key.startswith(("accuracy/", "accuracy_top5", "uar", "class_accuracy")):
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


def plot_accuracy(runs: dict[str, list[dict]], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    # a classifier's accuracy, else a retrieval model's R@1 sum (i2t + t2i Recall@1, percent)
    metric = "accuracy" if any("accuracy" in r for rows in runs.values() for r in rows) else "r1_sum"
    drawn = False
    for name, rows in runs.items():
        pts = [(r["round"], r[metric]) for r in rows if metric in r]
        if pts:
            ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, label=name)
            drawn = True
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy" if metric == "accuracy" else "R@1 sum (i2t + t2i, %)")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def compare(run_dirs: list[str | Path], plot_path: str | Path | None = None) -> str:
    """A Markdown table comparing runs (and an accuracy plot if ``plot_path``).

    When a run has per-modality metrics (a multimodal model), the table adds the
    final ``acc/<m>`` of each modality's own head and the joint output's ``UAR``
    (unweighted average recall); a run without one shows ``-``."""
    import tomllib

    runs = []
    for d in run_dirs:
        d = Path(d)
        rows = load_metrics(d)
        cfg_path = d / "config.toml"
        algo = tomllib.loads(cfg_path.read_text()).get("algorithm", {}).get("name", "?") if cfg_path.is_file() else "?"
        runs.append((d, algo, rows))
    finals = [_final_eval(rows) for _, _, rows in runs]
    mods = modality_columns(finals)
    multimodal = bool(mods) or any("uar" in f for f in finals)
    extra = [f"acc/{m}" for m in mods] + (["UAR"] if multimodal else [])
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
    for (d, algo, rows), final in zip(runs, finals):
        s = summarize(rows)
        cells = [d.name, algo, str(s["rounds"]), fmt(s["final_accuracy"]), fmt(s["best_accuracy"])]
        cells += [fmt(final.get(f"accuracy/{m}")) for m in mods]
        if multimodal:
            cells.append(fmt(final.get("uar")))
        if retrieval:
            keys = ["i2t_r1", "t2i_r1", "r1_sum"] + (["rsum_authors"] if authors else [])
            cells += ["-" if final.get(k) is None else f"{final[k]:.2f}" for k in keys]
        cells += [_human_bytes(s["bytes_up"]), _human_bytes(s["bytes_down"]), f"{s['mean_round_time_s'] or 0:.2f}"]
        if sim:
            cells.append(f"{s['sim_time_total_s']:.4g}" if "sim_time_total_s" in s else "-")
        if dp:
            cells.append(f"{s['dp_epsilon']:.3g} ({s['dp_delta']:.0e})" if "dp_epsilon" in s else "-")
        lines.append("| " + " | ".join(cells) + " |")
        curves[d.name] = rows
    if plot_path is not None:
        plot_accuracy(curves, plot_path)
    return "\n".join(lines)
