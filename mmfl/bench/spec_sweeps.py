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
from pathlib import Path

import numpy as np

from mmfl.bench.render import md_table
from mmfl.bench.spec_read import _Info, _m, _setting_local, axes, by_seed, value


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
    exists), then the failed runs (``rerun``: a command that reruns them) and non-finite metrics. A run
    is finished when the spec's ``done`` hook says so (else its summary.json exists); its final row is
    the first of ``final_keys`` it has; ``nonfinite = [keys]``: those of its final row that are not
    finite, and ``train_loss`` of any round (default: :meth:`mmfl.bench.Results.final`'s)."""
    from mmfl.bench.results import finite
    from mmfl.bench.runner import load_spec
    from mmfl.bench.status import problem_lines, run_status as status, runs_line

    keys, nf = block.get("final_keys", ["accuracy"]), block.get("nonfinite")

    def final(n):
        r = next((r for k in keys if (r := b.results.final(n, k))), None)
        if r is not None and nf is not None:
            bad_loss = any("train_loss" in x and not finite(x["train_loss"]) for x in b.results.rows(n))
            r = {**r, "_nonfinite": [k for k in nf if k in r and not finite(r[k])] + ["train_loss"] * bad_loss}
        return r
    st = status(b, final, getattr(load_spec(b.grid.tables), "done", None) if b.grid.tables else None)
    cmd = f.fill(block["rerun"]) if "rerun" in block else None
    out = [runs_line(len(st["finished"]), st["planned"], st["run_s"], b.last_invocation())]
    probs = problem_lines(st["failed"], st["nonfinite"], cmd)
    if block.get("part") == "problems":  # only the failed / non-finite runs (``part = "runs"``: only the line)
        return probs[:-1]
    return out + ([""] + probs[:-1] if probs and block.get("part") != "runs" else [])


def reading(b, block: dict, f) -> list[str]:
    """``## Reading the results`` and the file ``file`` (a field or a path relative to the grid's root);
    nothing when it is empty or absent."""
    from mmfl.bench.status import reading_lines

    path = f.fill(block["file"])
    return reading_lines(Path(b.grid.root) / path if path else None)[:-1]


def _row_items(b, block: dict, f) -> list[tuple[str, str | None, str, dict]]:
    """(group, setting, method, extra locals) per row: ``items = [{method, setting, group, ...}]``, else
    every method (``methods``: a list) at ``setting`` (``per_setting = true``: at each setting)."""
    g = block["group"]
    if "items" in block:
        return [(it.get("group", g), it.get("setting", block.get("setting")), it["method"],
                 {k: f.fill(v) for k, v in it.items() if k not in ("group", "setting", "method")})
                for it in block["items"]]
    settings = list(b.grid.settings(g)) if block.get("per_setting") else [block.get("setting")]
    return [(g, s, mk, {}) for s in settings for mk in block.get("methods", list(b.methods(g)))]


def _value_cell(b, g: str, mk: str, s: str | None, e, spec: dict, f) -> str:
    """A named value of a row: a metric, or ``otherwise`` where ``unless`` lists the method, the method's
    info lacks ``need_info`` or its ``group`` does not have it; ``info_value``: the method's info entry
    (through ``format``)."""
    spec = dict(spec)
    other = spec.pop("otherwise", spec.pop("absent", "—"))
    vg, vs = spec.pop("group", g), spec.pop("setting", s)
    if mk in spec.pop("unless", []) or ("need_info" in spec and not e.info.get(spec.pop("need_info"))) \
            or (vg != g and mk not in b.methods(vg)):
        return other
    spec.pop("need_info", None)
    if "info_value" in spec:  # the method's info entry (a table: its entry for the row's setting)
        v = e.info.get(spec["info_value"])
        v = v.get(s) if isinstance(v, dict) else v
        if v is not None and "times" in spec:  # x a field, rounded: "{clients...}" clients of a fraction
            v = int(round(v * f.lookup(spec["times"])))
        return other if v is None else format(v, spec.get("format", ""))
    seeds = b.grid.groups[spec.pop("seeds_of")].seeds if "seeds_of" in spec else None
    return value(b, b.names(vg, mk, vs, seeds), _m(spec), e.info)


def rows(b, block: dict, f) -> list[str]:
    """A row per (setting,) method or per ``items`` entry (see :func:`_row_items`) of ``cells``
    templates: ``{label}``, ``{key}``, ``{info.*}``, ``{setting}``, ``{sinfo.*}`` (the setting's info),
    the item's own keys and ``{v.<name>}``, each of ``values = { name = { key, reader, agg, ... } }``
    (:func:`_value_cell`), ``{set}`` (the method's ``set`` as ``--set`` arguments); ``row_when =
    "<k>"``: only methods whose info has it; ``complete = true``: only methods whose every seed
    finished; ``planned_only``: only rows with planned runs; ``per_seed = "<name>"``: a column per grid
    seed of that value's numbers."""
    out = []
    for g, s, mk, extra in _row_items(b, block, f):
        e = b.grid.entry(g, mk)
        names = b.names(g, mk, s) if {"planned_only", "complete", "per_seed"} & set(block) else {}
        if ("row_when" in block and not e.info.get(block["row_when"])) or (block.get("planned_only") and not names) \
                or (block.get("complete") and not all(b.results.finished(n) for n in names.values())):
            continue
        local = {"key": mk, "label": e.label, "info": _Info(e.info), "v": {},
                 "set": " ".join(f"{k}={json.dumps(v)}" for k, v in e.over.set.items()) or "(defaults)",
                 "setting": b.grid.settings(g)[s].label if s else "",
                 "sinfo": _Info(b.grid.settings(g)[s].info if s else {}), **extra}
        local["v"] = {name: _value_cell(b, g, mk, s, e, spec, f) for name, spec in block.get("values", {}).items()}
        row = [f.fill(c, **local) for c in block["cells"]]
        if "per_seed" in block:
            m = _m(block["values"][block["per_seed"]])
            vals = by_seed(b, names, m, e.info)
            row += [f"{m['scale'] * vals[x]:.{m['digits']}f}" if x in vals else "–" for x in b.grid.seeds]
        out.append(row)
    head = [f.fill(h) for h in block["header"]] + ([f"seed {x}" for x in b.grid.seeds] if "per_seed" in block else [])
    return md_table(head, out)


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
KINDS = {"sweep": sweep, "run_sums": run_sums, "run_status": run_status, "reading": reading, "rows": rows}
KEYS = {"split", "x", "col_head", "title", "row_label", "empty", "final_keys", "rerun", "file", "row_when",
        "split_field", "info_col", "extra_rows", "complete", "items", "planned_only", "setting",
        "nonfinite", "part"}
