"""Table specs as data: a benchmark's report described in TOML (``tables = "tables.toml"`` in its
grid) and rendered here, so a benchmark folder holds a grid and a spec instead of table code.

A spec is a list of ``[[blocks]]``, each rendered to lines followed by one empty line:

- ``text``: markdown, ``{...}`` fields filled from the grid and its runs (see :class:`Fields`);
- ``kind = "cells"``: one row per method of a group (``rows = "methods"``, ``"settings*methods"`` or a
  list of keys, then ``extra`` runs), columns from ``cells`` templates; ``{value}`` is the row's
  metric aggregated over seeds (``agg = "seed_cell"``: mean ± std [n seeds], diverged runs noted;
  ``"ms"``: mean ± std (n/N)); ``[blocks.row.<key>]`` overrides a row's ``label`` / ``cells`` and
  adds ``more`` (another metric's mean, formatted into the row as ``{more}``);
- ``kind = "pairs"``: paired differences a − b over seeds (bootstrap CI, ``scipy.stats.ttest_rel``;
  :func:`mmfl.bench.render.pair_row`), a claim made only from 5 paired seeds;
- ``kind = "rounds_to_reach"``: rounds each method's mean curve needs to reach ``base``'s final value;
- ``kind = "round_rows"``: per method and chosen round, the mean over seeds of metric keys of that row.

Format and examples: docs/benchmarks.md "Table specs"; benchmarks/moon/tables.toml.
"""

from __future__ import annotations

import statistics
import string
from pathlib import Path

import numpy as np

from mmfl.bench.grid import dotted_get
from mmfl.bench.render import PAIR_HEAD, md_table, ms, pair_row, seed_cell
from mmfl.config_raw import load_raw
from mmfl.errors import ConfigError

BLOCK_KEYS = {"text", "kind", "group", "rows", "extra", "header", "cells", "metric", "row", "pairs", "scale",
              "fail_value", "fail_note", "label_a", "label_b", "base", "exclude", "intro", "methods", "rounds",
              "columns", "digits", "missing", "when", "compare", "per_setting", "setting_head", "diff"}
METRIC_KEYS = {"key", "reader", "keep_failed", "agg", "scale", "digits"}


class Fields(string.Formatter):
    """``{ns.path}`` fields of a spec's templates: ``config.<group>.<dotted key>`` (the config of the
    group's first run: first method, setting and seed), ``params.<key>`` (the grid's ``[params]``), ``grid.seeds`` / ``grid.name``,
    ``machine`` (:func:`mmfl.sweep.machine`), ``runs.wall_h`` / ``runs.wall_s`` (the finished runs'
    summed wall time), ``runs.finished`` / ``runs.planned`` (counts), ``vars.<name>`` (the spec's ``[vars]``) and the block's own names (``label``, ``value``...)."""

    def __init__(self, b, spec: dict):
        super().__init__()
        self.b, self.spec, self._vars = b, spec, {}

    def get_field(self, field_name, args, kwargs):
        return self.lookup(field_name, kwargs), field_name

    def lookup(self, name: str, local: dict | None = None):
        local = local or {}
        if name in local:
            return local[name]
        ns, _, rest = name.partition(".")
        if ns in local:
            return dotted_get(local[ns], rest)
        b = self.b
        if ns == "config":
            group, _, key = rest.partition(".")
            cfg = b.config(group, None, next(iter(b.grid.settings(group))))  # its first run's config
            return dotted_get(cfg, key) if key else cfg
        if ns == "params":
            return dotted_get(b.params, rest)
        if ns == "grid":
            raw = b.grid.raw_dir
            shown = raw.relative_to(b.grid.root) if raw.is_relative_to(b.grid.root) else raw
            return {"seeds": b.grid.seeds, "name": b.grid.name, "raw_dir": str(shown)}[rest]
        if ns == "machine":
            import mmfl.sweep

            return mmfl.sweep.machine()
        if ns == "runs" and rest in ("wall_h", "wall_s", "finished"):
            done = [r for run in b.runs if (r := b.results.summary(run.name))]
            return {"wall_h": sum(r["wall_time_s"] for r in done) / 3600, "finished": len(done),
                    "wall_s": sum(r["wall_time_s"] for r in done)}[rest]
        if ns == "runs" and rest == "planned":
            return len(b.runs)
        if ns == "vars":
            return self.var(rest)
        raise ConfigError(f"table spec: unknown field {{{name}}}")

    def var(self, name: str):
        """A ``[vars.<name>]``: ``value`` (a field) shown through ``if_false`` when it is falsy (0,
        empty, absent), else through ``else`` (a template of ``{value}``)."""
        if name not in self._vars:
            v = self.spec.get("vars", {}).get(name)
            if v is None:
                raise ConfigError(f"table spec: no [vars.{name}]")
            if "expr" in v:  # arithmetic over fields: "{config.g.data.train_limit} // {config.g.partition.num_clients}"
                self._vars[name] = _arith(self.fill(v["expr"]))
            else:
                val = self.lookup(v["value"])
                self._vars[name] = self.fill(v["if_false"] if not val else v.get("else", "{value}"), value=val)
        return self._vars[name]

    def fill(self, template: str, **local) -> str:
        return self.vformat(template, (), local)


def _arith(text: str):
    """The value of ``text``, numbers joined by + - * / // and parentheses (nothing else)."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv}

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.left), ev(n.right))
        raise ConfigError(f"table spec: vars.expr: only numbers and + - * / // in {text!r}")
    return ev(ast.parse(text, mode="eval").body)


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
    if m["agg"] == "mean_stdev":  # sample standard deviation (n - 1)
        v, d = [m["scale"] * x for x in vals.values() if x is not None], m["digits"]
        return f"{statistics.mean(v):.{d}f} ± {statistics.stdev(v):.{d}f}" if len(v) > 1 else "—"
    raise ConfigError(f"table spec: metric.agg must be 'seed_cell', 'ms' or 'mean_stdev', got {m['agg']!r}")


def _compare(vals: dict, base: dict, m: dict) -> dict:
    """``{diff}``: the per-seed differences to the base method (x scale) as "mean [min, max]";
    ``{p}``: their paired t-test (``scipy.stats.ttest_rel``), over the seeds both have."""
    from scipy.stats import ttest_rel

    seeds = [k for k in vals if k in base and vals[k] is not None and base[k] is not None]
    if len(seeds) < 2:
        return {"diff": "—", "p": "—"}
    d, dg = [m["scale"] * (vals[k] - base[k]) for k in seeds], m["digits"]
    p = ttest_rel([vals[k] for k in seeds], [base[k] for k in seeds]).pvalue
    return {"diff": f"{statistics.mean(d):+.{dg}f} [{min(d):+.{dg}f}, {max(d):+.{dg}f}]", "p": f"{p:.3g}"}


def _rows(b, block: dict) -> list[tuple[str, str | None]]:
    """(method, setting) per row."""
    g = block["group"]
    rows = block.get("rows", "methods")
    if rows == "methods":
        out = [(m, None) for m in b.methods(g)]
    elif rows == "settings*methods":
        out = [(m, s) for s in b.grid.settings(g) for m in b.methods(g)]
    elif isinstance(rows, list):
        out = [(m, None) for m in rows]
    else:
        raise ConfigError(f"table spec: rows must be 'methods', 'settings*methods' or a list, got {rows!r}")
    return out + [(e, None) for e in block.get("extra", [])]


def cells(b, block: dict, f: Fields) -> list[str]:
    g, m = block["group"], _metric(block)
    body = []
    for method, setting in _rows(b, block):
        over = block.get("row", {}).get(method, {})
        entry = b.grid.entry(g, method)
        vals = _by_seed(b, g, method, setting, m)
        local = {"key": method, "label": entry.label, "value": _aggregate(vals, len(b.names(g, method, setting)), m),
                 "setting": b.grid.settings(g)[setting].label if setting else "", "info": entry.info or {}, "more": ""}
        if "compare" in block:
            local.update(_compare(vals, _by_seed(b, g, block["compare"], setting, m), m))
        local["label"] = f.fill(over.get("label", "{label}"), **local)
        if "more" in over:
            mm = _metric({"metric": over["more"]})
            v = b.vals(g, method, setting, key=mm["key"], reader=mm["reader"])
            local["more"] = f.fill(over["more_text"], mean=mm["scale"] * np.mean(v)) if v else ""
        body.append([f.fill(c, **local) for c in over.get("cells", block["cells"])])
    return md_table([f.fill(h) for h in block["header"]], body)


def _pair_side(b, g: str, side, setting: str | None, template: str, f: Fields) -> tuple[str, str | None, str]:
    method, label = (side.get("method"), side.get("label")) if isinstance(side, dict) else (side, None)
    s = side.get("setting", setting) if isinstance(side, dict) else setting
    local = {"key": method, "label": b.grid.entry(g, method).label,
             "setting": b.grid.settings(g)[s].label if s else ""}
    return method, s, label if label is not None else f.fill(template, **local)


def pairs(b, block: dict, f: Fields) -> list[str]:
    g, m = block["group"], _metric(block)
    out = list(PAIR_HEAD)
    every = list(b.grid.settings(g)) if block.get("per_setting") else [None]
    for setting, p in ((s, p) for s in every for p in block["pairs"]):
        a, c = (p["a"], p["b"]) if isinstance(p, dict) else (p[0], p[1])
        setting = setting or (p.get("setting") if isinstance(p, dict) else (p[2] if len(p) > 2 else None))
        ma, sa, la = _pair_side(b, g, a, setting, block.get("label_a", "{label}"), f)
        mb, sb, lb = _pair_side(b, g, c, setting, block.get("label_b", "{label}"), f)
        if block.get("per_setting") and not (b.names(g, ma, sa) and b.names(g, mb, sb)):
            continue  # a method not planned in this setting
        out.append(pair_row(la, lb, _by_seed(b, g, ma, sa, m), _by_seed(b, g, mb, sb, m), scale=m["scale"],
                            fail_value=block.get("fail_value"), fail_note=block.get("fail_note", "")))
    return out


def rounds_to_reach(b, block: dict, f: Fields) -> list[str]:
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


def round_rows(b, block: dict, f: Fields) -> list[str]:
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


def matrix(b, block: dict, f: Fields) -> list[str]:
    """One row per setting, one column per method: the metric aggregated over seeds (``(not run)``
    where the method is not planned in the setting)."""
    g, m = block["group"], _metric(block)
    rows = [[e.label, *[_aggregate(_by_seed(b, g, mk, sk, m), len(b.names(g, mk, sk)), m)
                        if b.names(g, mk, sk) else "(not run)" for mk in b.methods(g)]]
            for sk, e in b.grid.settings(g).items()]
    return md_table([f.fill(block.get("setting_head", "setting")), *[e.label for e in b.methods(g).values()]], rows)


def rounds_per_setting(b, block: dict, f: Fields) -> list[str]:
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


def per_seed(b, block: dict, f: Fields) -> list[str]:
    """One row per method, one column per grid seed: the metric x scale (``–`` where missing)."""
    g, m = block["group"], _metric(block)
    rows = []
    for method, setting in _rows(b, block):
        vals = _by_seed(b, g, method, setting, m)
        rows.append([b.grid.entry(g, method).label,
                     *[f"{m['scale'] * vals[s]:.{m['digits']}f}" if vals.get(s) is not None else "–"
                       for s in b.grid.seeds]])
    return md_table([f.fill(block.get("header", ["method"])[0]), *[f"seed {s}" for s in b.grid.seeds]], rows)


KINDS = {"cells": cells, "pairs": pairs, "rounds_to_reach": rounds_to_reach, "round_rows": round_rows,
         "per_seed": per_seed, "matrix": matrix, "rounds_per_setting": rounds_per_setting}


class TableSpec:
    """A loaded ``tables.toml``; :meth:`report` is what a Python spec's ``report(b)`` was."""

    def __init__(self, path: Path):
        self.path = path
        self.spec = load_raw(path)
        blocks = self.spec.get("blocks")
        if not isinstance(blocks, list) or not blocks:
            raise ConfigError(f"{path}: a table spec needs [[blocks]]")
        for i, bl in enumerate(blocks):
            if bad := set(bl) - BLOCK_KEYS:
                raise ConfigError(f"{path}: blocks[{i}]: unknown key {sorted(bad)[0]!r}")
            if "kind" in bl and bl["kind"] not in KINDS:
                raise ConfigError(f"{path}: blocks[{i}].kind: one of {', '.join(KINDS)}, got {bl['kind']!r}")
            if "kind" not in bl and "text" not in bl:
                raise ConfigError(f"{path}: blocks[{i}]: needs text or kind")
        self.FILES = tuple(self.spec.get("files", ()))

    def report(self, b) -> list[str]:
        f = Fields(b, self.spec)
        out = []
        for bl in self.spec["blocks"]:
            if "when" in bl and not f.lookup(bl["when"]):
                continue
            lines = KINDS[bl["kind"]](b, bl, f) if "kind" in bl else f.fill(bl["text"]).split("\n")
            out += [*lines, ""]
        sec = self.spec.get("section")
        if sec:  # the report is a section of another file, between two marker lines
            out = [sec["begin"], *out, sec["end"]]
            if target := f.lookup(sec["file"]):
                write_section(Path(b.grid.root) / target, out, sec["begin"], sec["end"])
        return out


def write_section(path: Path, lines: list[str], begin: str, end: str) -> None:
    """Replace the text between ``begin`` and ``end`` in ``path`` by ``lines`` (markers included);
    append it when the file has no markers yet."""
    old = path.read_text() if path.is_file() else ""
    text = "\n".join(lines)
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)
