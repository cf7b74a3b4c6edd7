"""Table-spec kinds of paired verdicts and rankings (:mod:`mmfl.bench.spec`): ``rank`` (where a method
ranks by its mean, per setting), ``verdict_matrix`` (paired verdicts a − b in a grid of rows x columns),
``pair_verdicts`` (per pair, each named metric's verdict through a template), ``round_trace`` (one run's
metrics rows) and ``list_rows`` (a list-valued metric's element-wise mean). Format: docs/benchmarks.md
"Table specs"."""

from __future__ import annotations

from mmfl.bench.render import md_table
from mmfl.bench.spec_read import _m, _means, _setting_local, axes, by_seed, list_means, lower_of


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


def pair_verdicts(b, block: dict, f) -> list[str]:
    """Rows of ``pairs = [{a, b, ...}, ...]`` (methods of ``group`` whose every seed finished; more keys:
    fields of the row), ``cells`` templates over ``{a}``, ``{b}``, the pair's keys and ``{v.<name>}``:
    per named metric of ``values`` the paired verdict of a − b over the seeds both have
    (:func:`mmfl.bench.spec_paired.claim_verdict`)
    through ``verdict`` (``{delta}``, ``{lo}``, ``{hi}``, ``{p}``, ``{n}``, ``{text}``; ``text``'s
    "holds" / "**reversed**" replaced by ``holds`` / ``reversed`` templates of ``{a}``, ``{b}``)."""
    from mmfl.bench.spec_paired import claim_verdict

    g, out = block["group"], []
    done = {mk for mk in b.methods(g) if all(b.results.finished(n) for n in b.names(g, mk).values())}
    for p in block["pairs"]:
        if p["a"] not in done or p["b"] not in done:
            continue
        local = {**p, "v": {}}
        for name, spec in block["values"].items():
            m = _m(spec)
            va, vb = (by_seed(b, b.names(g, x), {**m, "keep_failed": False}) for x in (p["a"], p["b"]))
            r = claim_verdict(va, vb, m["scale"])
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


KINDS = {"rank": rank, "verdict_matrix": verdict_matrix, "list_rows": list_rows, "pair_verdicts": pair_verdicts,
         "round_trace": round_trace}
KEYS = {"target", "ref", "summary", "lower", "list_key", "length", "verdict", "holds", "reversed", "method", "seed",
        "needs"}
