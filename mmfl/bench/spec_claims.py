"""Table-spec kinds of claims "a > b" judged by the seed spread (:func:`mmfl.sweep.verdict`; a paired
test is :mod:`mmfl.bench.spec_verdicts`'): ``claims`` (a table, or with ``count`` one sentence counting
its verdicts), ``gap_trend`` (a − b along an axis, and
whether it grows) and ``same_check`` (pairs that should agree: their means and largest per-seed
difference). A side is a method key or ``{ method, setting, group, label }``; its values are the metric
over its seeds (:func:`mmfl.bench.spec_read.by_seed`). Format: docs/benchmarks.md "Table specs"."""

from __future__ import annotations

import numpy as np

from mmfl.bench.render import claim_row, md_table, verdict_count
from mmfl.bench.spec_read import _m, by_seed
from mmfl.errors import ConfigError

CLAIM_HEAD = ["claim", "Δ (points)", "spread (std a + std b)", "here"]


def side(b, block: dict, s, f, m: dict) -> tuple[str, list[float]]:
    """(label, values) of a side (its ``label`` a template of ``{label}``, the method's label)."""
    d = s if isinstance(s, dict) else {"method": s}
    g, setting = d.get("group", block.get("group")), d.get("setting", block.get("setting"))
    e = b.grid.entry(g, d["method"])
    vals = by_seed(b, b.names(g, d["method"], setting), {**m, "key": d.get("key", m["key"])}, e.info)
    return f.fill(d.get("label", "{label}"), label=e.label), list(vals.values())


def _block(f, block: dict) -> dict:
    """``of = "<id>"``: the claims of the spec's block (or part) with that ``id``, this block's keys over it."""
    if "of" not in block:
        return block
    for bl in f.spec["blocks"]:
        for x in [bl, *bl.get("parts", [])]:
            if x.get("id") == block["of"]:
                return {**x, **{k: v for k, v in block.items() if k not in ("of", "id")}}
    raise ConfigError(f"table spec: of: no block with id {block['of']!r}")


def verdict_rows(b, block: dict, f) -> list[tuple[str, str]]:
    """(table line, verdict) per claim with values on both sides: ``chain = [side, ...]``: each side with
    values against the next one with values (``chain_label``), then ``pairs = [{a, b, label}]``
    (``label`` a template of ``{a}``, ``{b}``: the sides' labels; default "{a} > {b}")."""
    m = _m(block.get("metric"), agg="mean")
    out = []

    def add(text, va, vb):
        if va and vb:
            line, _, v = claim_row(text, va, vb, m["scale"], m["digits"])
            out.append((line, v))
    chain = [x for x in (side(b, block, s, f, m) for s in block.get("chain", [])) if x[1]]
    for (la, va), (lb, vb) in zip(chain, chain[1:]):
        add(f.fill(block.get("chain_label", "{a} > {b}"), a=la, b=lb), va, vb)
    for p in block.get("pairs", []):
        (la, va), (lb, vb) = side(b, block, p["a"], f, m), side(b, block, p["b"], f, m)
        add(f.fill(p.get("label", "{a} > {b}"), a=la, b=lb), va, vb)
    return out


def claims(b, block: dict, f) -> list[str]:
    """``intro``, then a table under ``header`` (default :data:`CLAIM_HEAD`) of :func:`verdict_rows`;
    nothing when no claim has values (``always = true``: the header anyway); ``count = "<template>"``:
    instead one line, ``{count}`` the verdicts counted (:func:`mmfl.bench.render.verdict_count` of ``what``)."""
    block = _block(f, block)
    rows = verdict_rows(b, block, f)
    if "count" in block:
        return [f.fill(block["count"], count=verdict_count([v for _, v in rows], block["what"]))] if rows else []
    if not rows and not block.get("always"):
        return []
    intro = [f.fill(block["intro"]), ""] if "intro" in block else []
    return intro + md_table([f.fill(h) for h in block.get("header", CLAIM_HEAD)], []) + [line for line, _ in rows]


def gap_trend(b, block: dict, f) -> list[str]:
    """``points = [{x, a, b}]``: the difference of the means a − b (x scale) at each x with values, as
    ``item`` (``{d}``, ``{x}``) joined by ", " from the largest x down, in ``line`` with ``{gaps}``,
    ``{d_hi}`` / ``{hi}`` (at the largest x), ``{d_lo}`` / ``{lo}`` and ``{word}``: ``grows`` when the
    difference at the smallest x is larger, else ``not``; nothing under two points."""
    m = _m(block.get("metric"), agg="mean")
    g = {}
    for p in block["points"]:
        va, vb = side(b, block, p["a"], f, m)[1], side(b, block, p["b"], f, m)[1]
        if va and vb:
            g[p["x"]] = claim_row("", va, vb, m["scale"], m["digits"])[1]
    if len(g) < 2:
        return []
    hi, lo = max(g), min(g)
    gaps = ", ".join(f.fill(block["item"], d=g[x], x=x) for x in sorted(g, reverse=True))
    word = f.fill(block["grows"] if g[lo] > g[hi] else block["not"])
    return [f.fill(block["line"], gaps=gaps, hi=hi, lo=lo, d_hi=g[hi], d_lo=g[lo], word=word)]


def same_check(b, block: dict, f) -> list[str]:
    """``pairs = [{a, b, label}]`` that should agree: ``item`` (``{label}``, ``{a}``, ``{b}``: the means x
    scale, ``{diff}``: the largest per-seed |a − b| x scale, nan when the seed counts differ) joined by "; "
    into ``line`` (``{items}``); nothing when no pair has values on both sides."""
    m = _m(block.get("metric"), agg="mean")
    items = []
    for p in block["pairs"]:
        (la, va), (lb, vb) = side(b, block, p["a"], f, m), side(b, block, p["b"], f, m)
        if va and vb:
            diff = max(abs(x - y) for x, y in zip(va, vb)) * m["scale"] if len(va) == len(vb) else float("nan")
            items.append(f.fill(block["item"], label=f.fill(p.get("label", "{a} vs {b}"), a=la, b=lb),
                                a=m["scale"] * np.mean(va), b=m["scale"] * np.mean(vb), diff=diff))
    return [f.fill(block["line"], items="; ".join(items))] if items else []


def _stats(b, block: dict, spec, f, m: dict) -> dict | None:
    """A side of a sentence (a method, or ``best_of = [methods]``: the one with the highest mean) with
    ``label``, ``mean`` and ``std`` (population) x scale; None without values."""
    d = spec if isinstance(spec, dict) else {"method": spec}
    mm = {**m, **{k: d[k] for k in ("key", "scale", "reader", "div") if k in d}}
    cands = [{**d, "method": x} for x in d.get("best_of", [d.get("method")])]
    got = [(x, v) for x in cands if (v := side(b, block, x, f, mm)[1])]
    if not got:
        return None
    x, v = max(got, key=lambda xv: float(np.mean(xv[1])))
    return {"label": side(b, block, x, f, mm)[0], "mean": mm["scale"] * float(np.mean(v)), "method": x["method"],
            "std": mm["scale"] * float(np.std(v)), "raw": float(np.mean(v))}


def compare_line(b, block: dict, f) -> list[str]:
    """A sentence of comparisons: ``sides = { name = <method> | { method | best_of, setting, key, scale } }``
    (:func:`_stats`: ``{name.label}``, ``{name.mean}``, ``{name.std}``), ``clauses = [{ text, needs = [names],
    diff = [x, y] ({d}: x − y of the means), differ = [x, y] (only when not the same method), ratio = [x, y] ({r}: x / y of the raw means) }]``, those whose
    sides have values joined by ``sep`` into ``line`` (``{clauses}``); nothing when none (or a side of the
    line's ``needs``) has values."""
    m = _m(block.get("metric"), agg="mean")
    st = {k: _stats(b, block, v, f, m) for k, v in block["sides"].items()}
    if any(st[k] is None for k in block.get("needs", [])):
        return []
    out = []
    for c in block["clauses"]:
        if any(st[k] is None for k in c.get("needs", [])) or (
                "differ" in c and st[c["differ"][0]]["method"] == st[c["differ"][1]]["method"]):
            continue  # ``differ = [x, y]``: only when the two sides are different methods
        extra = {"d": st[c["diff"][0]]["mean"] - st[c["diff"][1]]["mean"]} if "diff" in c else {}
        if "ratio" in c:
            extra["r"] = st[c["ratio"][0]]["raw"] / st[c["ratio"][1]]["raw"]
        out.append(f.fill(c["text"], **{k: v for k, v in st.items() if v is not None}, **extra))
    return [f.fill(block["line"], clauses=block.get("sep", "; ").join(out))] if out else []


def method_diffs(b, block: dict, f) -> list[str]:
    """Per method of ``group`` with values at both settings ``a`` and ``b``: ``item`` (``{label}``,
    ``{d}``: scale x (mean at a − mean at b)) joined by ", " into ``line`` (``{items}``)."""
    m, g = _m(block.get("metric"), agg="mean"), block["group"]
    items = []
    for mk, e in b.methods(g).items():
        va = side(b, block, {"method": mk, "setting": block["a"]}, f, m)[1]
        vb = side(b, block, {"method": mk, "setting": block["b"]}, f, m)[1]
        if va and vb:
            items.append(f.fill(block["item"], label=e.label, d=m["scale"] * (np.mean(va) - np.mean(vb))))
    return [f.fill(block["line"], items=", ".join(items))] if items else []


KINDS = {"claims": claims, "gap_trend": gap_trend, "same_check": same_check,
         "compare_line": compare_line, "method_diffs": method_diffs}
KEYS = {"id", "of", "chain", "chain_label", "always", "count", "what", "points", "item", "grows", "not", "setting",
        "sides", "clauses", "needs", "sep"}
