"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for reports organised by setting:
``each_setting`` (sub-blocks once per setting of a group, or once), ``stat_table`` (rows of grid
entries, cells of ``{ms.<key>}`` statistics), ``claims`` (paired "a > b" claims over seeds, with a
count sentence), ``stat_lines`` (sentences of rankings and statistics), ``config_lines`` (a
setting's resolved config as text), ``errorbar_figure`` (points of series over seeds, a plot and
its table) and ``file_text`` (runs finished and failed: ``run_status`` of :mod:`mmfl.bench.spec_sweeps`). Format: docs/benchmarks.md "Table specs"."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mmfl.bench.grid import dotted_get
from mmfl.bench.render import md_table, paired
from mmfl.bench.spec_values import V, Lazy, Stat, _entries, _fields, _label, _need, scoped, seed_vals, setting_of
from mmfl.errors import ConfigError

# ----------------------------------------------------------------------------- kinds


def each_setting(b, block: dict, f) -> list[str]:
    """``blocks`` (sub-blocks; a ``text`` one is a template) rendered one after the other, with no
    blank line between them (a top-level one drops its trailing blank lines), for each setting of ``group`` that meets ``need`` (without ``group``:
    once, at the enclosing setting); ``empty``: the text when no setting was rendered."""
    from mmfl.bench.spec import ALL_KEYS, KINDS

    for sub in block["blocks"]:
        if bad := set(sub) - ALL_KEYS:
            raise ConfigError(f"table spec: each_setting: unknown key {sorted(bad)[0]!r}")
    cur = f.lookup("setting") if _has(f, "setting") else None
    if "group" in block:
        if block["group"] not in b.grid.groups:  # a grid variant without the group (grid-quick.toml)
            return []
        settings = list(b.grid.settings(block["group"]))
    else:
        settings = [cur or None]
    out = []
    for st in settings:
        if "need" in block and not _need(b, block["need"], st):
            continue
        g = _fields(b, f, st, block.get("group"))
        for sub in block["blocks"]:
            if "need" in sub and sub.get("kind") != "each_setting" and not _need(b, sub["need"], st):
                continue
            if "kind" in sub:
                out += KINDS[sub["kind"]](b, {**sub, "setting": st, "nested": True}, g)
            else:
                out += g.fill(sub["text"]).split("\n")
    if not out and "empty" in block:
        return f.fill(block["empty"]).split("\n")
    while out and out[-1] == "" and not block.get("nested"):  # the spec adds one blank line after a block
        out.pop()
    return out


def _has(f, name) -> bool:
    try:
        f.lookup(name)
        return True
    except ConfigError:
        return False


def stat_table(b, block: dict, f) -> list[str]:
    """A markdown table of ``rows`` (each ``{group, entries = "methods" | "extra" | [keys], cells}``)
    at the block's setting; per row ``{label}``, ``{key}``, ``{info.<k>}``, ``{overrides}`` (the
    algorithm, then the entry's other ``set`` overrides as `key=value`), ``{ms.<metric key>}`` (a
    :class:`Stat` over the row's seeds, ``metric.reader``), ``{runs}`` (its runs with a value) and
    ``{<name>.<path>}`` of ``files = { name = "audit.json" }`` (a :class:`V` of its first run's file).
    A cell ``{ text, when, else }``: ``text`` when the field ``when`` is truthy, else ``else`` ("—").
    A row without a value of every ``skip`` key is left out. ``intro`` / ``outro``: text around the
    table, only when it has rows."""
    st, reader = block.get("setting"), block.get("metric", {}).get("reader", "final")
    rows = []
    for rs in block["rows"]:
        grp = rs["group"]
        if grp not in b.grid.groups:
            continue
        n = len(b.grid.groups[grp].seeds)
        for m in _entries(b, grp, rs.get("entries", "methods")):
            if not _filter(b, grp, m, block.get("filter")) or any(not seed_vals(b, grp, m, st, k, reader) for k in block.get("skip", [])):
                continue
            e = b.grid.entry(grp, m)
            over = dict(e.over.set)
            algo = over.pop("algorithm.name", None)
            names = b.names(grp, m, setting_of(b, grp, m, st)).values()
            files = {k: V(next((x for x in (b.results.file(nm, fn) for nm in names) if x is not None), None))
                     for k, fn in block.get("files", {}).items()}
            local = {"label": e.label, "key": m, "info": V(e.info), **files,
                     "runs": sum(b.results.file(nm, reader) is not None if reader.endswith(".json")
                                 else b.results.finished(nm) for nm in names),
                     "overrides": " ".join([f"`{algo}`"] * bool(algo) + [f"`{k}={str(v).lower()}`" for k, v in over.items()]),
                     "ms": Lazy(lambda k, grp=grp, m=m: Stat(list(seed_vals(b, grp, m, st, k, reader).values()), n))}
            g = scoped(f, **local)
            rows.append([g.fill(c) if isinstance(c, str) else g.fill(c["text"] if g.lookup(c["when"]) else c.get("else", "—"))
                         for c in rs.get("cells", block.get("cells"))])
    if not rows:
        return []
    out = f.fill(block["intro"]).split("\n") if "intro" in block else []
    out += md_table([f.fill(h) for h in block["header"]], rows)
    return out + (f.fill(block["outro"]).split("\n") if "outro" in block else [])


def _side(b, side, group, setting, key, reader) -> tuple[dict, str] | None:
    """A claim's side: a method key or ``{group, method, key, minus = <side>}`` (per-seed a − minus)."""
    d = side if isinstance(side, dict) else {"method": side}
    g, k = d.get("group", group), d.get("key", key)
    if g not in b.grid.groups or not (d["method"] in b.grid.groups[g].methods or d["method"] in b.grid.groups[g].extra):
        return None
    vals = seed_vals(b, g, d["method"], setting, k, reader)
    if "minus" in d:
        other = _side(b, d["minus"], g, setting, k, reader)
        vals = {s: vals[s] - other[0][s] for s in sorted(set(vals) & set(other[0] if other else {}))}
    return vals, _label(b, g, d["method"])


def _claims(b, block, f) -> list[tuple[dict, dict]]:
    g, st = block["group"], block.get("setting")
    m = block.get("metric", {})
    key, reader = m.get("key", "accuracy"), m.get("reader", "final")
    out, pairs = [], block["pairs"]
    for p in f.spec.get("pairs", {})[pairs] if isinstance(pairs, str) else pairs:  # a list of the spec's [pairs]
        d = p if isinstance(p, dict) else {"a": p[0], "b": p[1], **({"label": p[2]} if len(p) > 2 else {})}
        sides = [{**d, "a": x} for x in _entries(b, g, "methods")] if d["a"] == "*" else [d]
        for d in sides:
            a, c = _side(b, d["a"], g, st, key, reader), _side(b, d["b"], g, st, key, reader)
            if a is None or c is None:
                continue
            v = paired(a[0], c[0]) if sum(k in c[0] for k in a[0]) >= 1 else {"n": 0}
            if v["n"] < block.get("min_n", 2) and "untestable" not in block:
                continue
            extra = {k: f.fill(x) if isinstance(x, str) else x for k, x in d.items() if k not in ("a", "b", "label")}
            seeds = [s for s in sorted(a[0]) if s in c[0]]
            local = {**extra, "a": a[1], "b": c[1], "diffs": V([a[0][s] - c[0][s] for s in seeds]),
                     **{k: v.get(k) for k in ("delta", "lo", "hi", "p", "n")},
                     "word": v.get("word", "")}
            local["label"] = f.fill(d.get("label", "{a} > {b}"), **local)
            out.append((d, local, v))
    return out


def claims(b, block: dict, f) -> list[str]:
    """Paired claims "a > b" over seeds (:func:`mmfl.bench.render.paired`): ``pairs`` of
    ``[a, b]``, ``[a, b, label]`` or ``{a, b, label, count = false, <field> = ...}`` (or the name of
    a list in the spec's ``[pairs]``) (``a = "*"``: every
    method of the group); a side without values is left out, as is a pair under ``min_n`` (2)
    seeds unless ``untestable`` gives its row. Rows: ``line`` ({label} {a} {b} {delta} {lo} {hi} {p}
    {n} {word} {diffs}) under ``header``; then ``after``; then ``count`` (a sentence of {n} {held}
    (mean difference > 0) {holds} {reversed} {order}: the group's methods by mean) when one counted
    claim was made."""
    line = block.get("line", "| {label} | {delta:+.1f} | [{lo:+.1f}, {hi:+.1f}] | {p:.3f} | {word} |")
    out = md_table([f.fill(h) for h in block["header"]], []) if "header" in block else []
    counted = []
    for d, local, v in _claims(b, block, f):
        if line:
            out.append(f.fill(block["untestable"] if v["n"] < block.get("min_n", 2) else line, **local))
        if d.get("count", True) and v["n"] >= 2:
            counted.append(v)
    out += f.fill(block["after"]).split("\n") if "after" in block else []
    if counted and "count" in block:
        key = block.get("metric", {}).get("key", "accuracy")
        means = {m: np.mean(list(x.values())) for m in _entries(b, block["group"], "methods")
                 if (x := seed_vals(b, block["group"], m, block.get("setting"), key))}
        order = " > ".join(f"{_label(b, block['group'], m)} ({means[m]:.1f})" for m in sorted(means, key=lambda m: -means[m]))
        out += f.fill(block["count"], n=len(counted), held=sum(v["delta"] > 0 for v in counted), order=order,
                      holds=sum(v["word"] == "holds" for v in counted),
                      reversed=sum(v["word"] == "**reversed**" for v in counted)).split("\n")
    return out


def stat_lines(b, block: dict, f) -> list[str]:
    """Sentences (``lines``: templates, or ``{text, when}``: shown when every field of ``when``,
    "a and not b", is truthy) at the block's setting. Fields: ``{stat.<entry>}`` (a :class:`Stat` of
    the metric), ``{<values name>.<entry>}`` (``values = { mb = { key = "_mb_round" } }``),
    ``{<ranking>.…}`` (``rankings = { all = {}, het = { filter = "not info.weight_sharing" } }``: the
    group's methods with values by mean: ``n``, ``order``, ``pos.<m>``, ``first`` / ``last``
    (``.label``, ``.stat``), ``above.<entry>`` (``.n``, ``.labels``)), ``{lets.<name>}``
    (``lets = { r = "{mb.a.mean} / {mb.b.mean}" }``: arithmetic)."""
    from mmfl.bench.spec import _arith

    g, st = block["group"], block.get("setting")
    mets = {"stat": block.get("metric", {}), **block.get("values", {})}
    local = {name: Lazy(lambda e, m=m: Stat(list(seed_vals(b, g, e, st, m.get("key", "accuracy"),
                                                              m.get("reader", "final")).values())))
             for name, m in mets.items()}
    for name, r in block.get("rankings", {}).items():
        keep = [m for m in _entries(b, g, "methods") if local["stat"][m] and _filter(b, g, m, r.get("filter"))]
        rank = sorted(keep, key=lambda m: -local["stat"][m]["mean"])
        ent = lambda m: {"label": _label(b, g, m), "stat": local["stat"][m]}  # noqa: E731
        local[name] = {"n": len(rank), "pos": {m: i + 1 for i, m in enumerate(rank)},
                       "order": " > ".join(f"{_label(b, g, m)} ({local['stat'][m]['mean']:.1f})" for m in rank),
                       "first": ent(rank[0]) if rank else {}, "last": ent(rank[-1]) if rank else {},
                       "above": Lazy(lambda e, rank=rank: _above(b, g, rank, local["stat"], e))}
    h = scoped(f, **local)
    local["lets"] = Lazy(lambda k: _arith(h.fill(block["lets"][k])))
    h = scoped(f, **local)
    out = []
    for ln in block["lines"]:
        d = ln if isinstance(ln, dict) else {"text": ln}
        if all(bool(h.lookup(w.removeprefix("not "))) != w.startswith("not ") for w in d.get("when", "").split(" and ") if w):
            out += h.fill(d["text"]).split("\n")
    return out


def _filter(b, g, m, expr) -> bool:
    if not expr:
        return True
    neg = expr.startswith("not ")
    return bool(dotted_get({"info": b.grid.entry(g, m).info}, expr.removeprefix("not "))) != neg


def _above(b, g, rank, stat, ref) -> dict:
    if not stat[ref]:
        return {"n": 0, "labels": V([])}
    up = [m for m in rank if stat[m]["mean"] > stat[ref]["mean"]]
    return {"n": len(up), "labels": V([_label(b, g, m) for m in up])}


def config_lines(b, block: dict, f) -> list[str]:
    """``text`` once per setting of ``group``, from the resolved config of the first run of its entry ``methods``:
    ``{cfg.<path>}`` (a :class:`V`), ``{config_file}`` (the setting's first config file), ``{data.<split>}``
    (the size of a split of the data set, e.g. ``data.public``: loads it) and ``{list.<name>}``
    (``lists = { name = { each = "client_models", item = "...", sep = ", ", empty = "none" } }``)."""
    from mmfl.config import resolve
    from mmfl.data import DATASETS

    out, g = [], block["group"]
    for st, se in b.grid.settings(g).items():
        cfg = resolve(b.config(g, block.get("methods"), st))

        def size(split, cfg=cfg):
            part = getattr(DATASETS.get(cfg.data.name).factory(cfg.data.params), split)
            return len(part) if part is not None else 0
        lists = {k: L.get("sep", ", ").join(_fill_obj(L["item"], x) for x in getattr(cfg, L["each"])) or L.get("empty", "")
                 for k, L in block.get("lists", {}).items()}
        h = _fields(b, f, st)
        out += h.fill(block["text"], cfg=V(cfg), data=Lazy(size), list=lists,
                      config_file=os.path.relpath(se.config[0], b.grid.root)).split("\n")
    return out


def _fill_obj(template, obj) -> str:
    """``template`` with its fields read off ``obj`` (attributes or keys)."""
    import string

    class F(string.Formatter):
        def get_field(self, name, args, kwargs):
            return dotted_get({"o": V(obj)}, "o." + name), name
    return F().vformat(template, (), {})


def file_text(b, block: dict, f) -> list[str]:
    """``text`` with ``{content}``: the stripped text of ``file`` (a template, relative to the grid's
    root); nothing when ``file`` is empty or missing."""
    name = f.fill(block["file"])
    p = Path(b.grid.root) / name
    if not name or not p.is_file():
        return []
    return f.fill(block["text"], content=p.read_text().strip()).split("\n")


def json_lines(b, block: dict, f) -> list[str]:
    """Lines from a JSON file of each run (``file``, e.g. ``audit.json``) of the entries ``methods`` of
    ``group`` at the block's setting: per run, ``line`` (before its items), ``item`` for each item of
    the list or dict at ``each`` (a ``/`` path) and ``after``. Fields: ``{run.<path>}`` (the file, a
    :class:`V`), ``{item.<path>}``, ``{id}`` (the item's key or index), ``{label}``, ``{seed}``,
    ``{info.<k>}``. A run without the file (or the path) gives nothing."""
    g, out = block["group"], []
    for m in _entries(b, g, block.get("methods", "methods")):
        e = b.grid.entry(g, m)
        for seed, name in b.names(g, m, setting_of(b, g, m, block.get("setting"))).items():
            doc = b.results.file(name, block["file"])
            items = dotted_get(doc or {}, block["each"].replace("/", ".")) if "each" in block else []
            if doc is None or items is None:
                continue
            local = {"run": V(doc), "label": e.label, "seed": seed, "info": V(e.info)}
            pairs = items.items() if isinstance(items, dict) else enumerate(items)
            out += [f.fill(block["line"], **local)] if "line" in block else []
            out += [f.fill(block["item"], id=k, item=V(x), **local) for k, x in pairs] if "item" in block else []
            out += [f.fill(block["after"], **local)] if "after" in block else []
    return out


KINDS = {"each_setting": each_setting, "json_lines": json_lines, "stat_table": stat_table, "seed_claims": claims, "stat_lines": stat_lines,
         "config_lines": config_lines, "file_text": file_text}
KEYS = {"blocks", "need", "empty", "setting", "rows", "skip", "outro", "untestable", "after", "count", "min_n",
        "rankings", "lines", "lets", "lists", "file", "filter", "nested", "files", "each", "item"}
