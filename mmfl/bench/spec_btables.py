"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for sweeps over settings, run status,
rows of named values and figures:

- ``sweep``: methods x settings of a group, one table per value of a settings' ``info`` key (``split``),
  columns ordered by another (``x``), a ``base`` setting (the split value ``base``) first in each;
- ``run_sums``: per (setting, method) the mean over seeds of a metric summed over a run's rounds,
  the rows where it is not 0;
- ``rows``: one row per method (or per setting x method) of ``cells`` templates over named ``values``
  (``{v.<name>}``), each a metric of that method at a setting;
- ``run_status``: the planned runs' count, summed time, failed runs and non-finite metrics;
  ``reading``: a hand-written file under ``## Reading the results``;
- ``sweep_figure`` / ``xy_figure`` / ``bar_figure``: a PNG next to the report, and its markdown link.

Aggregations (``metric.agg``) besides :mod:`mmfl.bench.spec_kinds`' are ``outcome`` (mean ± std; failed
runs counted by cause: *diverged* when their message has one of ``fail_words``, else *stopped*;
``[k/N seeds]`` when some are missing) and ``first`` (the first seed's value; ``∞`` when infinite).
Format: docs/benchmarks.md "Table specs"."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from mmfl.bench.render import md_table
from mmfl.bench.spec_kinds import _aggregate
from mmfl.errors import ConfigError

DIVERGED = ("diverged", "non-finite", "nan")
METRIC = {"key": "accuracy", "reader": "final", "agg": "outcome", "scale": 100.0, "digits": 1, "keep_failed": False,
          "fail_words": list(DIVERGED), "eval_key": None, "minus": None}


def _m(d: dict | None, **over) -> dict:
    m = {**METRIC, **over, **(d or {})}
    if bad := set(m) - set(METRIC):
        raise ConfigError(f"table spec: metric: unknown key {sorted(bad)[0]!r} (allowed: {', '.join(sorted(METRIC))})")
    return m


class _Info(dict):
    def __missing__(self, key):
        return ""


def _key(m: dict, info: dict) -> str:
    """The metric key, ``{info.<k>}`` filled from the row's info (absent: "")."""
    return re.sub(r"\{info\.(\w+)\}", lambda mo: str(info.get(mo.group(1), "")), m["key"])


def diverged(b, name: str, words=DIVERGED) -> bool:
    msg = b.results.failed(name) or ""
    return any(w in msg for w in words)


def by_seed(b, names: dict[int, str], m: dict, info: dict | None = None) -> dict[int, float]:
    """``{seed: value}`` of the finished runs with a finite value; ``reader = "last:N"``: the mean of
    the key over a run's last N rows, else a reader of :meth:`mmfl.bench.Results.value`."""
    key, res = _key(m, info or {}), b.results
    if m["minus"]:  # per seed: key − minus
        va, vb = by_seed(b, names, {**m, "minus": None}, info), by_seed(b, names, {**m, "minus": None, "key": m["minus"]}, info)
        return {k: va[k] - vb[k] for k in va if k in vb}
    if not m["reader"].startswith("last:"):
        return res.by_seed(names, key, m["reader"], m["keep_failed"], m["eval_key"] or b.grid.eval_key)
    k = int(m["reader"][5:])
    vals = {s: float(np.mean([r[key] for r in res.rows(n)[-k:]])) for s, n in names.items() if res.finished(n)}
    return {s: v for s, v in vals.items() if math.isfinite(v)}


def value(b, names: dict[int, str], m: dict, info: dict | None = None) -> str:
    """One cell: the metric of the runs ``names`` ({seed: run}) aggregated over seeds."""
    key, res = _key(m, info or {}), b.results
    if m["agg"] == "first":
        for n in names.values():
            v = res.value(n, key, m["reader"], m["eval_key"]) if res.finished(n) else None
            if v is not None:
                return "∞" if math.isinf(v) else f"{m['scale'] * v:.{m['digits']}f}"
            if res.finished(n):
                return "–"
        return "–"
    if m["agg"] == "outcome":
        vals = res.by_seed(names, key, m["reader"], True, m["eval_key"] or b.grid.eval_key)
        ok = [v for v in vals.values() if v is not None and math.isfinite(v)]
        bad = [n for s, n in names.items() if vals.get(s, 0) is None]
        n_div = sum(diverged(b, n, m["fail_words"]) for n in bad)
        done, sc, dg = len(ok) + len(bad), m["scale"], m["digits"]
        txt = f"{sc * np.mean(ok):.{dg}f} ± {sc * np.std(ok):.{dg}f}" if ok else "–"
        notes = [f"{k} of {done} {what}" for k, what in ((n_div, "diverged"), (len(bad) - n_div, "stopped")) if k]
        return txt + (f" ({', '.join(notes)})" if notes else "") + \
            (f" [{done}/{len(names)} seeds]" if 0 < done < len(names) else "")
    return _aggregate(by_seed(b, names, m, info), len(names), m)


def axes(b, block: dict) -> tuple[dict[str, list[str]], str | None]:
    """``{split value: [settings ordered by info[x]]}`` of a block's group and its base setting
    (without ``split``: one table of every setting in the grid's order)."""
    g, split, x, base = block["group"], block.get("split"), block.get("x"), block.get("base")
    if not split:
        return {"": list(b.grid.settings(g))}, None
    out: dict[str, list[str]] = {}
    first = None
    for s, e in b.grid.settings(g).items():
        if e.info.get(split) == base:
            first = s
        else:
            out.setdefault(e.info[split], []).append(s)
    key = (lambda s: b.grid.settings(g)[s].info[x]) if x else None
    return {k: sorted(v, key=key) if key else v for k, v in out.items()}, first


def _setting_local(b, g: str, s: str) -> dict:
    e = b.grid.settings(g)[s]
    return {"setting": e.label, "info": e.info, "key": s}


def sweep(b, block: dict, f) -> list[str]:
    """Per split value: ``title`` (``{split}``, ``{stem}``: the first setting's label up to its last
    comma; ``{s}``: the entry ``split`` of the mapping the field ``split_field`` names), then methods
    (rows) x base + settings (columns ``col_head`` of ``{setting}``, ``{info.*}``); ``info_col = { key,
    sep, format, head }``: a last column joining the method's ``info[key]`` list (``head`` may use
    ``{x_values}``, the columns' ``info[x]``); ``extra_rows = { row_when, label, metric }``: rows again
    for the methods whose info has ``row_when``, with another metric."""
    g, m = block["group"], _m(block.get("metric"))
    splits, base = axes(b, block)
    ic, xr = block.get("info_col"), block.get("extra_rows")
    out = []
    for split, settings in splits.items():
        cols = ([base] if base else []) + settings
        head = [f.fill(block.get("header", ["method"])[0]),
                *[f.fill(block.get("col_head", "{setting}"), **_setting_local(b, g, s)) for s in cols]]
        xv = [b.grid.settings(g)[s].info.get(block.get("x")) for s in cols]
        head += [f.fill(ic["head"], x_values=xv)] if ic else []
        tail = (lambda e: [ic["sep"].join(format(v, ic["format"]) for v in e.info[ic["key"]])
                           if ic["key"] in e.info else "—"]) if ic else (lambda e: [])
        rows = [[e.label, *[value(b, b.names(g, mk, s), m, e.info) for s in cols], *tail(e)]
                for mk, e in b.methods(g).items()]
        if xr:
            mx = _m(xr.get("metric"), **{k: v for k, v in m.items() if k != "key"})
            rows += [[f.fill(xr["label"], label=e.label), *[value(b, b.names(g, mk, s), mx, e.info) for s in cols],
                      *(["—"] if ic else [])] for mk, e in b.methods(g).items() if e.info.get(xr["row_when"])]
        if "title" in block:
            stem = b.grid.settings(g)[settings[0]].label.rsplit(",", 1)[0] if settings else ""
            sv = (f.lookup(block["split_field"]) or {}).get(split, {}) if "split_field" in block else {}
            out += [f.fill(block["title"], split=split, stem=stem, s=sv), ""]
        out += [*md_table(head, rows), ""]
    return out[:-1]


def _means(b, g: str, setting: str, m: dict) -> dict[str, float]:
    """``{method: mean over seeds x scale}`` of the methods with a finite value at ``setting``."""
    out = {}
    for mk, e in b.methods(g).items():
        v = by_seed(b, b.names(g, mk, setting), m, e.info)
        if v:
            out[mk] = float(np.mean([m["scale"] * x for x in v.values()]))
    return out


def rank(b, block: dict, f) -> list[str]:
    """Per (split, setting) of :func:`axes`: where ``target`` ranks among the methods by their means,
    the best method, and ``target`` − ``ref``: rows of ``line`` (``{split}``, ``{x}``, ``{rank}``,
    ``{best}``, ``{best_mean}``, ``{diff}``, ``{n}``), then ``summary`` (``{wins}``, ``{total}``)."""
    g, m, t, ref = block["group"], _m(block.get("metric"), agg="mean"), block["target"], block["ref"]
    rows, wins = [], 0
    for split, settings in axes(b, block)[0].items():
        for s in settings:
            means = _means(b, g, s, m)
            if t not in means or ref not in means:
                continue
            order = sorted(means, key=lambda k: -means[k])
            wins += order[0] == t
            rows.append(f.fill(block["line"], split=split, x=b.grid.settings(g)[s].info.get(block.get("x")),
                               rank=order.index(t) + 1, best=b.methods(g)[order[0]].label, best_mean=means[order[0]],
                               diff=means[t] - means[ref]))
    head = md_table([f.fill(h, n=len(b.methods(g))) for h in block["header"]], [])
    return head + rows + ["", f.fill(block["summary"], wins=wins, total=len(rows))]


def verdict_matrix(b, block: dict, f) -> list[str]:
    """Paired verdicts a − b over seeds (:func:`mmfl.bench.render.verdict_cell`): a row per entry of
    ``rows`` ("methods": every method but ``a``, as ``b``) and a column per entry of ``columns``
    ("settings": every setting of the group, ``col_head`` of ``{setting}`` / ``{info.*}``); each entry a
    table of ``label`` / ``head``, ``a``, ``b``, ``setting``, ``key`` (a metric key, ``{info.*}`` of each
    side's method), merged row over block, column over row."""
    from mmfl.bench.render import paired, verdict_cell

    g, m = block["group"], _m(block.get("metric"))
    rws = block["rows"]
    if rws == "methods":
        rws = [{"label": e.label, "b": mk} for mk, e in b.methods(g).items() if mk != block.get("a")]
    cols = block["columns"]
    if cols == "settings":
        cols = [{"head": f.fill(block["col_head"], **_setting_local(b, g, s)), "setting": s} for s in b.grid.settings(g)]
    out = []
    for r in rws:
        cells = []
        for c in cols:
            d = {"a": block.get("a"), "key": m["key"], "setting": None, **r, **c}
            va, vb = (by_seed(b, b.names(g, d[x], d["setting"]), {**m, "key": d["key"]}, b.grid.entry(g, d[x]).info)
                      for x in ("a", "b"))
            cells.append(verdict_cell(paired(va, vb, scale=m["scale"])))
        out.append([f.fill(r["label"]), *cells])
    return md_table([f.fill(block["header"][0]), *[f.fill(c["head"]) for c in cols]], out)


def lower_of(b, spec: dict) -> str:
    """Of two names ``of``, the one whose metric ``key`` (``{m}``: the name) has the lower mean over
    the seeds of ``method`` at ``setting`` (the second when equal or unread)."""
    g, (x, y) = spec["group"], spec["of"]
    vx, vy = (b.vals(g, spec["method"], spec["setting"], key=spec["key"].format(m=n)) for n in (x, y))
    return y if (vx and vy and np.mean(vx) >= np.mean(vy)) else x


def list_means(b, g: str, method: str, setting: str, key: str, scale: float) -> list | None:
    """The mean over seeds, element-wise, of a list-valued metric of the final row (None: 0)."""
    per = [[scale * (v or 0.0) for v in r[key]] for n in b.names(g, method, setting).values()
           if (r := b.results.final(n)) and key in r]
    return list(np.mean(per, axis=0)) if per else None


def list_rows(b, block: dict, f) -> list[str]:
    """``title`` and a row per method of ``methods`` with ``list_key`` (``{lower}``: :func:`lower_of` of
    ``lower``) at ``setting``: its element-wise mean over seeds (x scale, ``digits``), min, max − min."""
    g, lo = block["group"], lower_of(b, block["lower"]) if "lower" in block else ""
    key, sc, d = block["list_key"].format(lower=lo), block.get("scale", 100.0), block.get("digits", 0)
    rows = []
    for mk in block["methods"]:
        if (pc := list_means(b, g, mk, block["setting"], key, sc)) is not None:
            rows.append([b.methods(g)[mk].label, *[f"{v:.{d}f}" for v in pc], f"{min(pc):.{d}f}",
                         f"{max(pc) - min(pc):.{d}f}"])
    n = len(rows[0]) - 3 if rows else block.get("length", 10)
    return [f.fill(block["title"], lower=lo), "",
            *md_table(["method", *[str(c) for c in range(n)], "min", "max − min"], rows)]


def run_sums(b, block: dict, f) -> list[str]:
    """Rows ``row_label`` (of the setting), method, mean over finished seeds of ``metric.key`` summed
    over each run's rounds, for every (non-base) setting and method where any run's sum is not 0."""
    g, key = block["group"], _m(block.get("metric"))["key"]
    rows = []
    for settings in axes(b, block)[0].values():
        for s in settings:
            for mk, e in b.methods(g).items():
                sums = [sum(r.get(key, 0) for r in b.results.rows(n))
                        for n in b.names(g, mk, s).values() if b.results.finished(n)]
                if sums and any(sums):
                    rows.append([f.fill(block["row_label"], **_setting_local(b, g, s)), e.label, f"{np.mean(sums):.1f}"])
    if not rows:
        return [f.fill(block["empty"])]
    return [f.fill(block["intro"]), "", *md_table([f.fill(h) for h in block["header"]], rows)]


def run_status(b, block: dict, f) -> list[str]:
    """``- Runs: n of N planned finished; summed run time ...`` (the last invocation's record when it
    exists), then the failed runs (``rerun``: a command that reruns them) and non-finite metrics."""
    from mmfl.bench.status import problem_lines, run_status as status, runs_line

    keys = block.get("final_keys", ["accuracy"])

    def final(n):
        return next((r for k in keys if (r := b.results.final(n, k))), None)
    st = status(b, final)
    cmd = f.fill(block["rerun"]) if "rerun" in block else None
    out = [runs_line(len(st["finished"]), st["planned"], st["run_s"], b.last_invocation())]
    probs = problem_lines(st["failed"], st["nonfinite"], cmd)
    return out + ([""] + probs[:-1] if probs else [])


def reading(b, block: dict, f) -> list[str]:
    """``## Reading the results`` and the file ``file`` (a field or a path relative to the grid's root);
    nothing when it is empty or absent."""
    from mmfl.bench.status import reading_lines

    path = f.fill(block["file"])
    return reading_lines(Path(b.grid.root) / path if path else None)[:-1]


def rows(b, block: dict, f) -> list[str]:
    """One row per method (``per_setting = true``: per setting x method; ``methods``: a list) of
    ``cells`` templates: ``{label}``, ``{key}``, ``{info.*}``, ``{setting}`` and ``{v.<name>}``, each of
    ``values = { name = { key, reader, agg, scale, digits, setting, group } }`` (``key`` may hold
    ``{info.<k>}``: the method's info), ``{set}`` (the method's ``set`` as ``--set`` arguments);
    ``row_when = "<k>"``: a row only where the method's info has it; ``complete = true``: only methods
    whose every seed finished; ``per_seed = "<name>"``: a column per grid seed of that value's numbers."""
    g = block["group"]
    out = []
    settings = list(b.grid.settings(g)) if block.get("per_setting") else [None]
    for s in settings:
        for mk in block.get("methods", list(b.methods(g))):
            e = b.grid.entry(g, mk)
            if "row_when" in block and not e.info.get(block["row_when"]):
                continue
            if block.get("complete") and not all(b.results.finished(n) for n in b.names(g, mk, s).values()):
                continue
            local = {"key": mk, "label": e.label, "info": _Info(e.info), "v": {},
                     "set": " ".join(f"{k}={json.dumps(v)}" for k, v in e.over.set.items()) or "(defaults)",
                     "setting": b.grid.settings(g)[s].label if s else ""}
            for name, spec in block.get("values", {}).items():
                spec = dict(spec)
                vg, vs = spec.pop("group", g), spec.pop("setting", s)
                if vg != g and mk not in b.methods(vg):
                    local["v"][name] = spec.get("absent", "—")
                    continue
                spec.pop("absent", None)
                seeds = b.grid.groups[spec.pop("seeds_of")].seeds if "seeds_of" in spec else None
                local["v"][name] = value(b, b.names(vg, mk, vs, seeds), _m(spec), e.info)
            row = [f.fill(c, **local) for c in block["cells"]]
            if "per_seed" in block:
                m = _m(block["values"][block["per_seed"]])
                vals = by_seed(b, b.names(g, mk, s), m, e.info)
                row += [f"{m['scale'] * vals[x]:.{m['digits']}f}" if x in vals else "–" for x in b.grid.seeds]
            out.append(row)
    head = [f.fill(h) for h in block["header"]] + ([f"seed {x}" for x in b.grid.seeds] if "per_seed" in block else [])
    return md_table(head, out)


def pair_verdicts(b, block: dict, f) -> list[str]:
    """Rows of ``pairs = [{a, b, ...}, ...]`` (methods of ``group`` whose every seed finished; more keys:
    fields of the row), ``cells`` templates over ``{a}``, ``{b}``, the pair's keys and ``{v.<name>}``:
    per named metric of ``values`` the paired verdict of a − b over seeds (:func:`mmfl.sweep.paired_verdict`)
    through ``verdict`` (``{delta}``, ``{lo}``, ``{hi}``, ``{p}``, ``{n}``, ``{text}``; ``text``'s
    "holds" / "**reversed**" replaced by ``holds`` / ``reversed`` templates of ``{a}``, ``{b}``)."""
    from mmfl.sweep import paired_verdict

    g, out = block["group"], []
    done = {mk for mk in b.methods(g) if all(b.results.finished(n) for n in b.names(g, mk).values())}
    for p in block["pairs"]:
        if p["a"] not in done or p["b"] not in done:
            continue
        local = {**p, "v": {}}
        for name, spec in block["values"].items():
            m = _m(spec)
            va, vb = (by_seed(b, b.names(g, x), {**m, "keep_failed": False}) for x in (p["a"], p["b"]))
            r = paired_verdict(list(va.values()), list(vb.values()), scale=m["scale"])
            text = r["text"].replace("holds", f.fill(block.get("holds", "holds"), **p)).replace(
                "**reversed**", f.fill(block.get("reversed", "**reversed**"), **p))
            local["v"][name] = f.fill(block["verdict"], **{**r, "text": text})
        out.append([f.fill(c, **local) for c in block["cells"]])
    return md_table([f.fill(h) for h in block["header"]], out)


def round_trace(b, block: dict, f) -> list[str]:
    """``title`` and a row per metrics row of one run (``method``, ``seed``: default the grid's first):
    ``columns = [[key, digits, scale], ...]`` (an absent key is nan), when its last row has ``needs``."""
    g, method = block["group"], block["method"]
    seed = block.get("seed", b.grid.seeds[0])
    name = b.names(g, method).get(seed) if method in b.methods(g) else None
    trace = b.results.rows(name) if name else []
    if not trace or block.get("needs", "round") not in trace[-1]:
        return []
    rows = [[f"{sc * r.get(k, float('nan')):.{d}f}" for k, d, sc in block["columns"]] for r in trace]
    return [f.fill(block["title"], seed=seed), "", *md_table([f.fill(h) for h in block["header"]], rows)]


def _group_field(b, rest: str):
    """``group.<g>.seeds`` / ``.has_runs`` / ``.label``."""
    g, _, what = rest.partition(".")
    grp = b.grid.groups[g]
    return {"seeds": grp.seeds, "has_runs": any(r.group == g for r in b.runs), "label": grp.label}[what]


def _stat_field(b, rest: str):
    """``stat.finished`` (planned runs with a summary), ``stat.round_wall_s`` / ``_min`` (their rounds'
    wall times, summed), ``stat.failed`` (the failed runs' names, sorted, comma-separated), ``stat.n_failed``."""
    if rest == "finished":
        return len(b.finished())
    if rest in ("round_wall_s", "round_wall_min"):
        s = sum(r.get("wall_time_s", 0.0) for n in b.finished() for r in b.results.rows(n))
        return s / 60 if rest == "round_wall_min" else s
    failed = sorted(n for n, _ in b.failed())
    return {"failed": ", ".join(failed), "n_failed": len(failed)}[rest]


def _invocation_field(b, rest: str):
    """``invocation.<k>`` of this invocation's record (runs, workers, wall_s, wall_min); None without."""
    inv = b.invocation
    return None if inv is None else (inv["wall_s"] / 60 if rest == "wall_min" else inv[rest])


FIELDS = {"group": _group_field, "stat": _stat_field, "invocation": _invocation_field}
KINDS = {"sweep": sweep, "run_sums": run_sums, "run_status": run_status, "reading": reading, "rows": rows,
         "pair_verdicts": pair_verdicts, "round_trace": round_trace, "rank": rank, "verdict_matrix": verdict_matrix,
         "list_rows": list_rows}
KEYS = {"split", "x", "col_head", "title", "row_label", "empty", "final_keys", "rerun", "file", "row_when",
        "figure", "series", "x_scale", "fail_value", "panel_cols", "xlabel", "ylabel", "xscale", "ref", "bars",
        "size", "dpi", "legend", "ref_label", "list_key", "xticks_rotation", "legend_cols", "fontsize", "setting",
        "bar_width", "methods_of", "plot_title", "complete",
        "verdict", "holds", "reversed", "method", "seed", "needs",
        "split_field", "info_col", "extra_rows", "target", "ref", "summary", "lower", "list_key", "length", "alt"}

from mmfl.bench import spec_figures  # noqa: E402  (the figure kinds, a module of their own)

KINDS.update(spec_figures.KINDS)
