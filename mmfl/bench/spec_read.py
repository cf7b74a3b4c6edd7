"""What the table-spec kinds of :mod:`mmfl.bench.spec_sweeps`, :mod:`mmfl.bench.spec_verdicts` and
:mod:`mmfl.bench.spec_figures` read: a block's metric (``metric = { key, reader, agg, ... }``) over the
runs of a method, aggregated into one cell, and the settings of a group split by an info key.

Aggregations (``agg``) besides :mod:`mmfl.bench.spec_kinds`' are ``outcome`` (mean ± std; failed runs
counted by cause: *diverged* when their message has one of ``fail_words``, else *stopped*; ``[k/N seeds]``
when some are missing) and ``first`` (the first seed's value; ``∞`` when infinite); ``reader = "last:N"``:
the mean over a run's last N rows; ``minus``: per seed, key − minus; ``key`` may hold ``{info.<k>}``."""

from __future__ import annotations

import math
import re

import numpy as np

from mmfl.bench.spec_kinds import _aggregate
from mmfl.errors import ConfigError

DIVERGED = ("diverged", "non-finite", "nan")
METRIC = {"key": "accuracy", "reader": "final", "agg": "outcome", "scale": 100.0, "digits": 1, "keep_failed": False,
          "fail_words": list(DIVERGED), "eval_key": None, "minus": None, "div": 1.0}
ROW_STATS = {"first": lambda v: v[0] if v else None, "sum": lambda v: float(sum(v)) if v else None,
             "mean": lambda v: float(np.mean(v)) if v else None,
             "later": lambda v: float(np.mean(v[1:])) if len(v) > 1 else float("nan")}


def _row_stat(rows: list[dict], key: str):
    """``reader = "rows"``: ``<stat>:<metric key>`` over a run's rows that have it (first, mean, later:
    the mean over the rows after the first)."""
    stat, _, k = key.partition(":")
    if stat not in ROW_STATS:
        raise ConfigError(f"table spec: reader rows: key '<{'|'.join(ROW_STATS)}>:<metric>', got {key!r}")
    return ROW_STATS[stat]([r[k] for r in rows if k in r])


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
    """``{seed: value}`` of the finished runs with a finite value (divided by ``div``); ``reader =
    "last:N"``: the mean of the key over a run's last N rows; ``"rows"``: :func:`_row_stat`; else a
    reader of :meth:`mmfl.bench.Results.value`."""
    if isinstance(m["key"], list):  # per seed, the first key the run has a value of
        out: dict = {}
        for k in m["key"]:
            out.update({s: v for s, v in by_seed(b, names, {**m, "key": k}, info).items() if s not in out})
        return {s: out[s] for s in names if s in out}
    key, res = _key(m, info or {}), b.results
    if m["minus"]:  # per seed: key − minus
        va, vb = by_seed(b, names, {**m, "minus": None}, info), by_seed(b, names, {**m, "minus": None, "key": m["minus"]}, info)
        return {k: va[k] - vb[k] for k in va if k in vb}
    if m["reader"] == "rows":
        vals = {s: _row_stat(res.rows(n), key) for s, n in names.items() if res.finished(n)}
    elif m["reader"].startswith("last:"):
        k = int(m["reader"][5:])
        vals = {s: float(np.mean([r[key] for r in res.rows(n)[-k:]])) for s, n in names.items() if res.finished(n)}
    else:
        vals = res.by_seed(names, key, m["reader"], m["keep_failed"], m["eval_key"] or b.grid.eval_key)
        return vals if m["div"] == 1.0 else {s: v if v is None else v / m["div"] for s, v in vals.items()}
    return {s: v / m["div"] for s, v in vals.items() if v is not None and math.isfinite(v)}


def value(b, names: dict[int, str], m: dict, info: dict | None = None) -> str:
    """One cell: the metric of the runs ``names`` ({seed: run}) aggregated over seeds."""
    key, res = (m["key"] if isinstance(m["key"], list) else _key(m, info or {})), b.results
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


def _means(b, g: str, setting: str, m: dict) -> dict[str, float]:
    """``{method: mean over seeds x scale}`` of the methods with a finite value at ``setting``."""
    out = {}
    for mk, e in b.methods(g).items():
        v = by_seed(b, b.names(g, mk, setting), m, e.info)
        if v:
            out[mk] = float(np.mean([m["scale"] * x for x in v.values()]))
    return out


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
