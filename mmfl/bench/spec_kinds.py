"""The block kinds of a TOML table spec (:mod:`mmfl.bench.spec`): each renders a block's lines
from the finished runs (``b``: :class:`mmfl.bench.Bench`) and the spec's fields (``f``: a
:class:`mmfl.bench.spec.Fields`, not imported here: spec imports this module)."""

from __future__ import annotations

import statistics

import numpy as np

from mmfl.bench.render import PAIR_HEAD, md_table, ms, pair_row, seed_cell
from mmfl.errors import ConfigError

METRIC_KEYS = {"key", "reader", "keep_failed", "agg", "scale", "digits"}


def _metric(block: dict) -> dict:
    m = {"key": "accuracy", "reader": "final", "keep_failed": False, "agg": "seed_cell", "scale": 100.0, "digits": 1,
         **block.get("metric", {})}
    if bad := set(m) - METRIC_KEYS:
        raise ConfigError(f"table spec: metric: unknown key {sorted(bad)[0]!r} (allowed: {', '.join(sorted(METRIC_KEYS))})")
    return m


def _by_seed(b, group: str, method: str, setting: str | None, m: dict) -> dict:
    return b.by_seed(group, method, setting, key=m["key"], reader=m["reader"], keep_failed=m["keep_failed"])


def _aggregate(vals: dict, n_expected: int, m: dict) -> str:
    if m["agg"] == "seed_cell":
        return seed_cell(vals, scale=m["scale"], digits=m["digits"])
    if m["agg"] == "ms":
        return ms([v for v in vals.values() if v is not None], n_expected, m["digits"], m["scale"])
    v, d = [m["scale"] * x for x in vals.values() if x is not None], m["digits"]
    if m["agg"] == "mean_stdev":  # sample standard deviation (n - 1)
        return f"{statistics.mean(v):.{d}f} ± {statistics.stdev(v):.{d}f}" if len(v) > 1 else "—"
    raw, sc = [x for x in vals.values() if x is not None], m["scale"]  # mean of the values, then x scale
    if m["agg"] == "mean_pstd":  # population standard deviation, no seed count
        return f"{sc * np.mean(raw):.{d}f} ± {sc * np.std(raw):.{d}f}" if raw else "—"
    if m["agg"] == "mean":
        return f"{sc * np.mean(raw):.{d}f}" if raw else "—"
    raise ConfigError("table spec: metric.agg must be 'seed_cell', 'ms', 'mean_stdev', 'mean_pstd' or 'mean', "
                      f"got {m['agg']!r}")


def _compare(vals: dict, base: dict, m: dict) -> dict:
    """``{diff}``: the per-seed differences to the base method (x scale) as "mean [min, max]";
    ``{p}``: their paired t-test (:func:`mmfl.sweep.paired_verdict`'s), over the seeds both have."""
    from mmfl.sweep import paired_verdict

    seeds = [k for k in vals if k in base and vals[k] is not None and base[k] is not None]
    if len(seeds) < 2:
        return {"diff": "—", "p": "—"}
    d, dg = [m["scale"] * (vals[k] - base[k]) for k in seeds], m["digits"]
    p = paired_verdict([vals[k] for k in seeds], [base[k] for k in seeds])["p"]
    return {"diff": f"{statistics.mean(d):+.{dg}f} [{min(d):+.{dg}f}, {max(d):+.{dg}f}]", "p": f"{p:.3g}"}


def _rows(b, block: dict) -> list[tuple[str, str | None]]:
    """(method, setting) per row."""
    g = block["group"]
    rows = block.get("rows", "methods")
    if rows == "methods":
        out = [(m, None) for m in b.methods(g)]
    elif rows == "settings*methods":
        out = [(m, s) for s in b.grid.settings(g) for m in b.methods(g)]
    elif rows == "plan":  # every setting x the methods planned in all, then the methods planned in some
        every = [m for m, e in b.methods(g).items() if not e.settings]
        out = [(m, s) for s in b.grid.settings(g) for m in every] + \
            [(m, s) for s in b.grid.settings(g) for m, e in b.methods(g).items() if e.settings and s in e.settings]
    elif isinstance(rows, list):
        out = [(m, None) for m in rows]
    else:
        raise ConfigError(f"table spec: rows must be 'methods', 'settings*methods', 'plan' or a list, got {rows!r}")
    return out + [(e, None) for e in block.get("extra", [])]


def cells(b, block: dict, f) -> list[str]:
    g, m = block["group"], _metric(block)
    body = []
    for method, setting in _rows(b, block):
        over = block.get("row", {}).get(method, {})
        entry = b.grid.entry(g, method)
        vals = _by_seed(b, g, method, setting, m)
        local = {"key": method, "label": entry.label, "value": _aggregate(vals, len(b.names(g, method, setting)), m),
                 "setting": b.grid.settings(g)[setting].label if setting else "", "info": entry.info or {}, "more": ""}
        local["v"] = {}  # ``values = { name = <metric> }``: more aggregates of the row, as {v.name}
        for k, x in block.get("values", {}).items():
            mv = _metric({"metric": x})
            local["v"][k] = _aggregate(_by_seed(b, g, method, setting, mv), len(b.names(g, method, setting)), mv)
        if "compare" in block:
            local.update(_compare(vals, _by_seed(b, g, block["compare"], setting, m), m))
        local["label"] = f.fill(over.get("label", "{label}"), **local)
        if "more" in over:
            mm = _metric({"metric": over["more"]})
            v = b.vals(g, method, setting, key=mm["key"], reader=mm["reader"])
            local["more"] = f.fill(over["more_text"], mean=mm["scale"] * np.mean(v)) if v else ""
        body.append([f.fill(c, **local) for c in over.get("cells", block["cells"])])
    return md_table([f.fill(h) for h in block["header"]], body)


def _pair_side(b, g: str, side, setting: str | None, template: str, f, m: dict) -> tuple[str, str | None, str, dict]:
    """A side of a pair: a method key or ``{method, setting, key, label}``; its metric (``key``
    overrides the block's metric key) and its label (``{key}``, ``{label}``, ``{setting}``, ``{metric}``)."""
    d = side if isinstance(side, dict) else {"method": side}
    method, s, mm = d["method"], d.get("setting", setting), {**m, "key": d.get("key", m["key"])}
    local = {"key": method, "label": b.grid.entry(g, method).label,
             "setting": b.grid.settings(g)[s].label if s else "", "metric": mm["key"]}
    return method, s, d["label"] if "label" in d else f.fill(template, **local), mm


def pairs(b, block: dict, f) -> list[str]:
    """Paired differences a − b per pair (and per setting with ``per_setting``): rows of
    :data:`PAIR_HEAD` (:func:`pair_row`), or, with ``line`` (a row template of ``{setting}``, ``{a}``,
    ``{b}``, ``{mean}``, ``{lo}``, ``{hi}``, ``{p}``, ``{n}``, ``{seeds_note}``: ``seeds_note`` filled
    when fewer than the grid's seeds pair up) under ``header``, pairs of 2+ seeds only;
    ``bootstrap = "shared"``: every row's resamples drawn in table order from one generator (seed 0)."""
    g, m = block["group"], _metric(block)
    line = block.get("line")
    out = md_table([f.fill(h) for h in block["header"]], []) if line else list(PAIR_HEAD)
    rng = np.random.default_rng(0) if block.get("bootstrap") == "shared" else None
    every = list(b.grid.settings(g)) if block.get("per_setting") else [None]
    for setting, p in ((s, p) for s in every for p in block["pairs"]):
        a, c = (p["a"], p["b"]) if isinstance(p, dict) else (p[0], p[1])
        setting = setting or (p.get("setting") if isinstance(p, dict) else (p[2] if len(p) > 2 else None))
        ma, sa, la, mta = _pair_side(b, g, a, setting, block.get("label_a", "{label}"), f, m)
        mb, sb, lb, mtb = _pair_side(b, g, c, setting, block.get("label_b", "{label}"), f, m)
        if block.get("per_setting") and not (b.names(g, ma, sa) and b.names(g, mb, sb)):
            continue  # a method not planned in this setting
        va, vb = _by_seed(b, g, ma, sa, mta), _by_seed(b, g, mb, sb, mtb)
        if not line:
            out.append(pair_row(la, lb, va, vb, scale=m["scale"],
                                fail_value=block.get("fail_value"), fail_note=block.get("fail_note", "")))
        elif (r := _pair_stats(va, vb, m["scale"], rng)) is not None:
            note = "" if r["n"] == len(b.grid.seeds) else f.fill(block.get("seeds_note", ""), n=r["n"])
            out.append(f.fill(line, setting=b.grid.settings(g)[setting].label if setting else "", a=la, b=lb,
                              seeds_note=note, **r))
    return out


def _pair_stats(va: dict, vb: dict, scale: float, rng) -> dict | None:
    """mean, 95% bootstrap CI (10,000 resamples; from ``rng``, else :func:`mmfl.sweep.paired_verdict`'s
    own generator) and paired t-test p of a − b over the seeds both have; None under 2 seeds."""
    from mmfl.sweep import paired_verdict

    seeds = sorted(k for k in va if k in vb and va[k] is not None and vb[k] is not None)
    if len(seeds) < 2:
        return None
    v = paired_verdict([va[k] for k in seeds], [vb[k] for k in seeds], scale, rng=rng)
    return {"mean": v["delta"], "lo": v["lo"], "hi": v["hi"], "p": v["p"], "n": len(seeds)}


def rounds_to_reach(b, block: dict, f) -> list[str]:
    from mmfl.report import rounds_to_reach as reach

    g, base, key = block["group"], block["base"], _metric(block)["key"]
    methods = {k: e for k, e in b.methods(g).items() if k not in block.get("exclude", [])}
    curves = {k: b.results.mean_curve(b.names(g, k), key) for k in methods}
    if not curves.get(base):
        return [block.get("missing", f"(no {base} runs)")]
    target = curves[base][-1][key]
    first = reach(curves[base], target)
    rounds = f.lookup(f"config.{g}.rounds")
    rows = []
    for k, c in curves.items():
        r = reach(c, target)
        rows.append([methods[k].label, *([str(r), f"{first / r:.2f}×"] if r else [f"not reached in {rounds}", "<1×"]),
                     ", ".join(f"{100 * x[key]:.1f}" for x in c)])
    return [f.fill(block["intro"], target=100 * target), "",
            *md_table([f.fill(h) for h in block["header"]], rows)]


def round_rows(b, block: dict, f) -> list[str]:
    """Per (setting,) method and round: the mean over finished seeds of the accuracy and of each
    column's key; ``rounds``: a list (``"last"``: the shortest run's last round) or a field;
    ``diff = [key_a, key_b, label]``: a last column, the mean of key_a − key_b (signed)."""
    g, cols, digits, diff = block["group"], block["columns"], block.get("digits", 3), block.get("diff")
    want = f.lookup(block["rounds"]) if isinstance(block["rounds"], str) else block["rounds"]
    per = block.get("per_setting")
    rows = []
    for setting in (b.grid.settings(g) if per else [None]):
        for method in block["methods"]:
            runs = [b.results.rows(n) for n in b.names(g, method, setting).values() if b.results.finished(n)]
            if not runs:
                continue
            rounds = sorted({min(len(r) for r in runs) if x == "last" else x for x in want}) if "last" in want else want
            for rnd in rounds:
                at = [r[rnd - 1] for r in runs if len(r) >= rnd]
                vals = [[row[k] for row in at if k in row] for k, _ in cols]
                row = [b.methods(g)[method].label, str(rnd) if per else rnd,
                       f"{100 * np.mean([row['accuracy'] for row in at]):.1f}",
                       *[f"{np.mean(v):.{digits}f}" if v else "–" for v in vals]]
                if diff:
                    d = [x[diff[0]] - x[diff[1]] for x in at if diff[1] in x]
                    row.append(f"{np.mean(d):+.{digits}f}" if d else "–")
                rows.append(([b.grid.settings(g)[setting].label] if per else []) + row)
    head = ([block.get("setting_head", "setting")] if per else []) + ["method", "round", "accuracy",
                                                                      *[label for _, label in cols]]
    return md_table(head + ([diff[2]] if diff else []), rows)


def matrix(b, block: dict, f) -> list[str]:
    """One row per setting, one column per method: the metric aggregated over seeds (``(not run)``
    where the method is not planned in the setting)."""
    g, m = block["group"], _metric(block)
    rows = [[e.label, *[_aggregate(_by_seed(b, g, mk, sk, m), len(b.names(g, mk, sk)), m)
                        if b.names(g, mk, sk) else "(not run)" for mk in b.methods(g)]]
            for sk, e in b.grid.settings(g).items()]
    return md_table([f.fill(block.get("setting_head", "setting")), *[e.label for e in b.methods(g).values()]], rows)


def rounds_per_setting(b, block: dict, f) -> list[str]:
    """Per setting and method: rounds to reach ``base``'s mean final value at the same setting, on
    the mean curve and per seed, and the mean curve."""
    from mmfl.report import rounds_to_reach as reach

    g, base, key = block["group"], block["base"], _metric(block)["key"]
    rows = []
    for sk, s in b.grid.settings(g).items():
        curve = b.results.mean_curve(b.names(g, base, sk), key)
        if not curve:
            continue
        t = curve[-1][key]
        for mk, e in b.methods(g).items():
            names = b.names(g, mk, sk)
            c = b.results.mean_curve(names, key)
            if not c:
                continue
            per = [reach([x for x in b.results.rows(n) if key in x], t) for n in names.values() if b.results.finished(n)]
            rows.append([f"{s.label} (target {100 * t:.1f})", e.label, reach(c, t) or "–",
                         ", ".join("–" if p is None else str(p) for p in per),
                         ", ".join(f"{100 * x[key]:.1f}" for x in c)])
    return md_table([f.fill(h) for h in block["header"]], rows)


def per_seed(b, block: dict, f) -> list[str]:
    """One row per method, one column per grid seed: the metric x scale (``–`` where missing)."""
    g, m = block["group"], _metric(block)
    rows = []
    for method, setting in _rows(b, block):
        vals = _by_seed(b, g, method, setting, m)
        rows.append([b.grid.entry(g, method).label,
                     *[f"{m['scale'] * vals[s]:.{m['digits']}f}" if vals.get(s) is not None else "–"
                       for s in b.grid.seeds]])
    return md_table([f.fill(block.get("header", ["method"])[0]), *[f"seed {s}" for s in b.grid.seeds]], rows)


def paired_rows(b, block: dict, f) -> list[str]:
    """Per setting and metric (``metrics = [[key, label], ...]``): method ``b``'s and ``a``'s mean ± std
    over the seeds both finished, the paired difference a − b (x scale), its 95% bootstrap CI, the
    paired t-test's p, the number of seeds and the verdict (:func:`mmfl.sweep.paired_verdict`; made only
    from ``min_seeds``); ``per_seed = key``: a row of that metric's per-seed differences after it."""
    from mmfl.sweep import paired_verdict

    g, ma, mb, m = block["group"], block["a"], block["b"], _metric(block)
    sc, dg, n_min = m["scale"], m["digits"], block.get("min_seeds", 5)

    def cell(v):
        return f"{sc * np.mean(v):.{dg}f} ± {sc * np.std(v):.{dg}f}" if v else "—"
    rows = []
    for sk, s in b.grid.settings(g).items():
        for key, what in block["metrics"]:
            va, vb = (_by_seed(b, g, x, sk, {**m, "key": key}) for x in (ma, mb))
            seeds = [k for k in b.grid.seeds if va.get(k) is not None and vb.get(k) is not None]
            if not seeds:
                rows.append([f"{s.label}: {what}", "—", "—", "not run here", "", "", 0, ""])
                continue
            a, c = [va[k] for k in seeds], [vb[k] for k in seeds]
            v = paired_verdict(a, c, sc)
            word = v["word"] if len(seeds) >= n_min else f"not claimed ({len(seeds)} seeds)"
            rows.append([f"{s.label}: {what}", cell(c), cell(a), f"{v['delta']:+.{dg}f}",
                         f"[{v['lo']:+.{dg}f}, {v['hi']:+.{dg}f}]", f"{v['p']:.3g}", len(seeds), word])
            if key == block.get("per_seed"):
                rows.append([f"{s.label}: {f.fill(block['per_seed_label'])}", "", "",
                             ", ".join(f"s{k} {sc * (x - y):+.{dg}f}" for k, x, y in zip(seeds, a, c)), "", "", "", ""])
    head = md_table([f.fill(h) for h in block["header"]], [])
    return head + ["|" + "".join(f" {c} |" if c != "" else " |" for c in r) for r in rows]  # empty cells: "| |"


KINDS = {"cells": cells, "pairs": pairs, "rounds_to_reach": rounds_to_reach, "round_rows": round_rows,
         "per_seed": per_seed, "matrix": matrix, "rounds_per_setting": rounds_per_setting, "paired_rows": paired_rows}
