"""FedMSplit graph benchmark tables (grid: grid.toml): per setting and variant the last round's
``accuracy`` (each client's personalized model on its own test rows), ``global/personal_accuracy``
(the global model on the same rows), ``global/accuracy`` (the global model on the whole test set)
and the learned graph's mean self-weight; then the paired differences of ``params.pairs`` per
setting (mean, 95% bootstrap CI, paired t-test p). Python, not a TOML spec: its bootstrap draws
every pair's resamples from one generator in table order (the published numbers depend on it)."""

from __future__ import annotations

import numpy as np

GROUP = "graph"


def plan(b) -> list[tuple[str, str]]:
    """(setting, method) rows: every setting x the methods planned everywhere, then the rest."""
    g = b.grid.groups[GROUP]
    every = [m for m, e in g.methods.items() if not e.settings]
    return [(s, m) for s in g.settings for m in every] + \
        [(s, m) for s in g.settings for m, e in g.methods.items() if e.settings and s in e.settings]


def last_rows(b, setting: str, method: str) -> dict[int, dict]:
    out = {}
    for seed, name in b.names(GROUP, method, setting).items():
        rows = b.results.rows(name)
        if rows:
            out[seed] = rows[-1]
    return out


def tables(b) -> list[str]:
    from scipy.stats import ttest_rel

    R = {(s, v): last_rows(b, s, v) for s, v in plan(b)}

    def ms(vals):
        return f"{100 * np.mean(vals):.1f} ± {100 * np.std(vals):.1f}" if vals else "—"

    lines = ["| setting | variant | personalized `accuracy` | global model, same rows `global/personal_accuracy` "
             "| global model `global/accuracy` | mean A_ii |", "|---|---|---|---|---|---|"]
    for (s, v), d in R.items():
        get = lambda k: [d[x][k] for x in sorted(d)]  # noqa: E731
        sw = get("msplit_self_weight") if d and "msplit_self_weight" in next(iter(d.values())) else []
        lines.append(f"| {s} | {v} | {ms(get('accuracy'))} | {ms(get('global/personal_accuracy'))} | "
                     f"{ms(get('global/accuracy'))} | " + (f"{np.mean(sw):.2f} |" if sw else "— |"))
    lines += ["", "| setting | difference (points, paired by seed) | mean | 95% bootstrap CI | paired t p |",
              "|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for s in b.grid.settings(GROUP):
        for a, bm, ka, kb in b.params["pairs"]:
            da, db = R.get((s, a), {}), R.get((s, bm), {})
            seeds = sorted(set(da) & set(db))
            if len(seeds) < 2:
                continue
            diff = np.array([100 * (da[x][ka] - db[x][kb]) for x in seeds])
            boot = diff[rng.integers(0, len(diff), (10000, len(diff)))].mean(1)
            lo, hi = np.quantile(boot, [0.025, 0.975])
            p = ttest_rel([da[x][ka] for x in seeds], [db[x][kb] for x in seeds]).pvalue
            lines.append(f"| {s} | {a} `{ka}` − {bm} `{kb}` | {diff.mean():+.1f} | [{lo:+.1f}, {hi:+.1f}] | "
                         f"{p:.3f} |" + ("" if len(seeds) == len(b.grid.seeds) else f" ({len(seeds)} seeds)"))
    return lines


def report(b) -> list[str]:
    return ["# FedMSplit's graph on mfeat pair", "",
            f"Regenerate: `{b.params['command']}` (`--tables-only` rebuilds this file from the runs in "
            f"`{b.grid.raw_dir.name}/`). Seeds {b.grid.seeds}; the last round's values, mean ± std over seeds (%).",
            "", *tables(b), ""]
