"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) whose rows are a group's settings and
whose columns are its methods, and paired tests between settings per method (benchmarks/missing:
the missing-modality policies). Each kind is ``fn(b, block, f) -> lines`` (docs/benchmarks.md
"Table specs").

- ``setting_rows``: one row per setting (``row_label``, a template of ``{label}`` / ``{key}``), one
  column per method (``col_head``, a template of the method's ``{label}``; the first column's head is
  ``setting_head``); each cell is the ``cell`` template over ``{v.<name>}``, the aggregates of
  ``values = { name = <metric> }`` over the seeds (``agg = "mean_pstd_n"``: "mean ± std", the
  population std, with " (n=k)" when k of the planned seeds finished, "—" when none).
- ``setting_pairs``: per method, per pair ``[a, b]`` of setting keys in ``pairs``: the paired
  difference a − b over the seeds both have (:func:`mmfl.bench.render.paired`: bootstrap CI and
  ``scipy.stats.ttest_rel``), a row of the ``line`` template (``{method}`` ``{a}`` ``{b}`` the
  labels, ``{delta}`` ``{lo}`` ``{hi}`` ``{p}`` ``{n}``, ``{verdict}``: holds / unresolved /
  **reversed**) under ``header``."""

from __future__ import annotations

import numpy as np

from mmfl.bench.render import md_table, paired
from mmfl.bench.spec_kinds import _aggregate, _by_seed, _metric


def _agg(vals: dict, n_planned: int, m: dict) -> str:
    if m["agg"] != "mean_pstd_n":
        return _aggregate(vals, n_planned, m)
    v = np.asarray([x for x in vals.values() if x is not None], dtype=float) * m["scale"]
    if not len(v):
        return "—"
    d = m["digits"]
    return f"{v.mean():.{d}f} ± {v.std():.{d}f}" + ("" if len(v) == n_planned else f" (n={len(v)})")


def setting_rows(b, block: dict, f) -> list[str]:
    g, methods = block["group"], b.methods(block["group"])
    specs = {k: _metric({"metric": x}) for k, x in block["values"].items()}
    rows = []
    for sk, s in b.grid.settings(g).items():
        row = [f.fill(block.get("row_label", "{label}"), label=s.label, key=sk)]
        for mk in methods:
            n = len(b.names(g, mk, sk))
            row.append(f.fill(block["cell"], v={k: _agg(_by_seed(b, g, mk, sk, m), n, m) for k, m in specs.items()}))
        rows.append(row)
    head = [f.fill(block.get("setting_head", "setting")),
            *[f.fill(block.get("col_head", "{label}"), label=e.label, key=mk) for mk, e in methods.items()]]
    return md_table(head, rows)


def setting_pairs(b, block: dict, f) -> list[str]:
    g, m = block["group"], _metric(block)
    settings = b.grid.settings(g)
    out = md_table([f.fill(h) for h in block["header"]], [])
    for mk, e in b.methods(g).items():
        for a, c in block["pairs"]:
            v = paired(_by_seed(b, g, mk, a, m), _by_seed(b, g, mk, c, m), scale=m["scale"])
            out.append(f.fill(block["line"], method=e.label, a=settings[a].label, b=settings[c].label,
                              verdict=v["word"], **{k: v[k] for k in ("delta", "lo", "hi", "p", "n")}))
    return out


KINDS = {"setting_rows": setting_rows, "setting_pairs": setting_pairs}
KEYS = {"row_label", "col_head", "setting_head", "cell", "values"}
