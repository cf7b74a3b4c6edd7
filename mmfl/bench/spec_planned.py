"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for columns that follow the grid:

- ``planned_columns``: :func:`mmfl.bench.spec_paired.setting_columns` over only the settings of
  ``group`` (or ``settings``) where some method has planned runs (a quick grid that leaves settings
  out drops their columns); a ``header`` entry ``{ per_setting = "<template>" }`` becomes one heading
  per such setting, with ``{sinfo.<k>}`` (the setting's info) and ``{setting}`` (its key);
  ``split = "<info key>"``: the rows once per value of the settings' info (in order), each over the
  settings with that value (the headings from the first), ``{split}`` in ``cells`` its
  ``labels`` entry (``labels = { <info value> = "<label>" }``; ``{lab.<k>}``: an info value's label).
- ``value_list``: ``line`` with ``{items}``: per method (``methods``, default the group's) and planned
  setting (``settings``) whose ``metric`` has values, ``item`` (``{label}``, ``{v}``: the values
  aggregated, ``{lab.<k>}``...) joined by ``sep`` (default "; "); nothing without values (``need_all``:
  unless every method has values at every such setting); ``method_line`` (``{label}``, ``{items}``
  joined by ``item_sep``): one part per method instead.
- ``pooled_line``, ``same_seeds``: one sentence each (:func:`pooled_line`, :func:`same_seeds`).
- ``best_vs``: one sentence: the sides' means, and the best one tested against the first (:func:`best_vs`).
- ``order_line``: one sentence: the methods by their means, and by reference values (:func:`order_line`).
- ``round_columns``: a column per evaluated round, a row per method, and paired claims on chosen rounds
  (:func:`round_columns`).
- ``item_rows``: a row per entry of ``items = [{ group, setting, method, <name> = ... }]`` (``planned_only``:
  only entries with planned runs) of ``cells`` templates of the entry's names and ``{v.<name>}``, each
  of ``values = { name = <metric> }`` (:mod:`mmfl.bench.spec_read` metrics; ``method`` / ``setting`` /
  ``group`` read another cell's runs; ``prefix``: one "name value" per key after it, ``:func:_item_value``).

Each kind is ``fn(b, block, f) -> lines`` (docs/benchmarks.md "Table specs")."""

from __future__ import annotations

import os
from pathlib import Path
from collections import Counter

import numpy as np

from mmfl.bench.render import md_table
from mmfl.bench.results import finite
from mmfl.bench.spec_read import _m, value
from mmfl.errors import ConfigError
from mmfl.bench.spec_paired import _agg, _metric, by_seed, claim_head, claim_line, claim_verdict, setting_columns


def planned_settings(b, g: str, settings: list[str] | None = None) -> list[str]:
    """The settings of group ``g`` (or ``settings``) with planned runs of some method."""
    return [s for s in settings or b.grid.settings(g) if any(b.names(g, m, s) for m in b.methods(g))]


def _local(b, g: str, s: str, block: dict) -> dict:
    """A setting's names in a template: ``setting`` (its key), ``sinfo`` (its info), ``lab`` (its info
    values through the block's ``labels``)."""
    info = b.grid.settings(g)[s].info
    return {"setting": s, "sinfo": info, "lab": {k: block.get("labels", {}).get(v, v) for k, v in info.items()}}


def value_list(b, block: dict, f) -> list[str]:
    g, m = block["group"], _metric(block.get("metric"))
    items, per_method = [], []
    for mk in block.get("methods") or list(b.methods(g)):
        mine = []
        for s in planned_settings(b, g, block.get("settings")):
            if vals := by_seed(b, g, mk, s, m):
                mine.append(f.fill(block["item"], label=b.grid.entry(g, mk).label, v=_agg(vals, len(b.names(g, mk, s)), m),
                                   **_local(b, g, s, block)))
            elif block.get("need_all"):
                return []
        items += mine
        if mine and "method_line" in block:
            per_method.append(f.fill(block["method_line"], label=b.grid.entry(g, mk).label,
                                     items=block.get("item_sep", ", ").join(mine)))
    if per_method:
        items = per_method
    return [f.fill(block["line"], items=block.get("sep", "; ").join(items))] if items else []


def pooled_line(b, block: dict, f) -> list[str]:
    """``line`` with ``{mean}``: the mean of ``metric`` over every finished run of ``method`` at every
    setting of ``settings`` (pooled, not a mean of means; x scale); nothing without values."""
    g, m = block["group"], _metric(block.get("metric"))
    vals = [v for s in block["settings"] if s in b.grid.settings(g) for v in by_seed(b, g, block["method"], s, m).values()]
    return [f.fill(block["line"], mean=m["scale"] * float(np.mean(vals)))] if vals else []


def same_seeds(b, block: dict, f) -> list[str]:
    """``line`` with ``{items}``: per pair ``{ a, b, label }`` (sides ``{ group, method, setting }``) with
    seeds where both have every ``keys`` metric, ``item`` (``{label}``, ``{same}``: the seeds where
    every metric agrees within its ``tol``, ``{n}``) joined by ``sep``; nothing without such seeds."""
    items = []
    for p in block["pairs"]:
        sides = []
        for sd in (p["a"], p["b"]):
            got = [by_seed(b, sd.get("group", block.get("group")), sd["method"], sd.get("setting"), _metric(k))
                   for k in ({x: y for x, y in k.items() if x != "tol"} for k in block["keys"])]
            sides.append({s: [v[s] for v in got] for s in got[0] if all(s in v for v in got)})
        both = [s for s in sides[0] if s in sides[1]]
        if both:
            same = sum(all(abs(x - y) <= k.get("tol", 0.0) for x, y, k in zip(sides[0][s], sides[1][s], block["keys"]))
                       for s in both)
            items.append(f.fill(block["item"], label=p["label"], same=same, n=len(both)))
    return [f.fill(block["line"], items=block.get("sep", "; ").join(items))] if items else []


def planned_columns(b, block: dict, f) -> list[str]:
    g = block["group"]
    settings = planned_settings(b, g, block.get("settings"))
    split = block.get("split")  # rows per value of the settings' info[split], columns its settings
    values = list(dict.fromkeys(b.grid.settings(g)[s].info[split] for s in settings)) if split else [None]
    out = []
    for val in values:
        cols = [s for s in settings if val is None or b.grid.settings(g)[s].info[split] == val]
        head = []
        for h in block["header"]:
            head += [h] if isinstance(h, str) else [f.fill(h["per_setting"], **_local(b, g, s, block)) for s in cols]
        label = block.get("labels", {}).get(val, val)
        cells = [c.replace("{split}", str(label)) if isinstance(c, str) else c for c in block["cells"]]
        lines = setting_columns(b, {**block, "settings": cols, "cells": cells,
                                    "header": [x.replace("{", "{{").replace("}", "}}") for x in head]}, f)
        out += lines if not out else lines[2:]
    return out


def _family(b, names: dict, prefix: str) -> list[str]:
    """The keys after ``prefix`` in the final row of the first finished run of ``names`` (sorted)."""
    for n in names.values():
        if r := b.results.final(n):
            return sorted(k[len(prefix):] for k, v in r.items() if k.startswith(prefix) and finite(v))
    return []


def _item_value(b, it: dict, spec: dict, f) -> str:
    """A value of an ``item_rows`` row: ``spec``'s metric (:func:`mmfl.bench.spec_read.value`) over the
    runs of the row's group / setting / method, each overridable by ``spec``; ``prefix``: every key
    after it in the final row (``item`` of ``{name}`` and ``{v}``, joined by ``sep``; ``absent``: none)."""
    spec = dict(spec)
    g, s, mk = (spec.pop(k, it.get(k)) for k in ("group", "setting", "method"))
    other, prefix = spec.pop("absent", "—"), spec.pop("prefix", None)
    item, sep = spec.pop("item", "{name} {v}"), spec.pop("sep", ", ")
    if mk not in b.methods(g) or s not in b.grid.settings(g):
        return other
    names = b.names(g, mk, s)
    if prefix is None:
        return value(b, names, _m(spec))
    keys = _family(b, names, prefix)
    return sep.join(f.fill(item, name=k, v=value(b, names, _m({**spec, "key": prefix + k}))) for k in keys) or other


def item_rows(b, block: dict, f) -> list[str]:
    body = []
    for it in block["items"]:
        it = {"group": block.get("group"), **it}
        if block.get("planned_only") and not b.names(it["group"], it["method"], it.get("setting")):
            continue
        v = {k: _item_value(b, it, spec, f) for k, spec in block.get("values", {}).items()}
        body.append([f.fill(c, **it, v=v) for c in block["cells"]])
    return md_table([f.fill(h) for h in block["header"]], body)


def best_vs(b, block: dict, f) -> list[str]:
    """``line`` with ``{values}`` ("label: mean" of each side with values, joined by ", ") and ``{tail}``:
    ``better`` (``{best}``, and the paired test of the best against the first side: ``{delta}``, ``{lo}``,
    ``{hi}``, ``{p}``, ``{n}``, ``{word}``) when another side has the highest mean, else ``same``;
    nothing unless 2 sides have values. A side: ``{ group, method, setting, label }``."""
    m = _metric(block.get("metric"))
    got = {}
    for sd in block["sides"]:
        if vals := by_seed(b, sd.get("group", block.get("group")), sd["method"], sd.get("setting"), m):
            got[sd["label"]] = vals
    if len(got) < 2:
        return []
    ref, mean = block["sides"][0]["label"], {k: float(np.mean(list(v.values()))) for k, v in got.items()}
    best = max(got, key=lambda k: mean[k])
    tail = block["same"]
    if best != ref and ref in got:
        tail = f.fill(block["better"], best=best, **claim_verdict(got[best], got[ref], m["scale"]))
    values = ", ".join(f"{k}: {m['scale'] * mean[k]:.{m['digits']}f}" for k in got)
    return [f.fill(block["line"], values=values, tail=f.fill(tail))]


def order_line(b, block: dict, f) -> list[str]:
    """``line`` with ``{order}``: the methods of ``group`` with values at ``setting``, by their mean
    (highest first), each ``item`` (``{label}``, ``{mean}``: x scale) joined by ``sep`` (default ", "),
    and ``{ref_order}``: the methods by the block's ``ref = { method = value }`` (highest first),
    joined by ``ref_sep`` (default " > "); nothing when no method has values."""
    g, m = block["group"], _metric(block.get("metric"))
    methods = b.methods(g)
    got = {mk: np.mean(list(v.values())) for mk in methods if (v := by_seed(b, g, mk, block.get("setting"), m))}
    if not got:
        return []
    item = block.get("item", "{label} ({mean:.1f})")
    order = block.get("sep", ", ").join(f.fill(item, label=methods[k].label, mean=m["scale"] * got[k])
                                        for k in sorted(got, key=lambda k: -got[k]))
    ref = block.get("ref", {})
    ref_order = block.get("ref_sep", " > ").join(f.fill(item, label=methods[k].label, mean=ref[k])
                                                 for k in sorted((k for k in methods if k in ref), key=lambda k: -ref[k]))
    return [f.fill(block["line"], order=order, ref_order=ref_order)]


def _at(b, name: str, rnd: int, keys: list[str], default=None) -> float | None:
    """The first of ``keys`` a run's row of round ``rnd`` has (``default`` where none); None if not finite."""
    for r in b.results.rows(name) or []:
        if r.get("round") == rnd:
            v = next((r[k] for k in keys if k in r), default)
            return float(v) if v is not None and finite(v) else None
    return None


def round_columns(b, block: dict, f) -> list[str]:
    """A row per method of ``group`` at ``setting``, a column per round that ``ref``'s runs evaluated
    (their rows with ``accuracy``): the mean over runs of ``key`` (a list: the first a row has) x
    ``scale``; ``extra = [{ label, method, key, default, digits, scale }]``: more rows; ``claims =
    [{ text, rounds }]``: ``ref`` > each other method, paired by seed on the mean of the value at
    ``rounds`` (templates of ``{last}``, the run's rounds, and ``{early}`` = last − ``early``); ``intro``
    first; nothing when ``ref`` has no evaluated rows."""
    g, st, ref = block["group"], block.get("setting"), block["ref"]
    m = _metric(block.get("metric"))
    keys = m["key"] if isinstance(m["key"], list) else [m["key"]]
    names = {mk: b.names(g, mk, st) for mk in b.methods(g)}
    if not names.get(ref):
        return []
    evals = sorted({r["round"] for n in names[ref].values() for r in b.results.rows(n) or [] if "accuracy" in r})
    if not evals:  # no run of ref evaluated yet (the old script wrote a table without columns)
        return []

    def row(label, mk, ks, scale, digits, default=None):
        cells = [[v for n in names[mk].values() if (v := _at(b, n, x, ks, default)) is not None] for x in evals]
        return [label, *(f"{scale * np.mean(c):.{digits}f}" if c else "—" for c in cells)]
    body = [row(b.grid.entry(g, mk).label, mk, keys, m["scale"], m["digits"]) for mk in names]
    body += [row(e["label"], e["method"], [e["key"]], e.get("scale", 1.0), e.get("digits", 1), e.get("default"))
             for e in block.get("extra", [])]
    out = md_table(["method", *(f"round {x}" for x in evals)], body)
    last = int(b.config(g, ref, st)["rounds"])
    when = {"last": last, "early": last - block.get("early", 5)}
    rows = []
    for c in block.get("claims", []):
        rounds = [int(f.fill(x, **when)) for x in c["rounds"]]

        def vals(mk):
            out = {}
            for seed, n in names[mk].items():
                v = [_at(b, n, x, keys) for x in rounds]
                if all(x is not None for x in v):
                    out[seed] = float(np.mean(v)) if len(v) > 1 else v[0]
            return out
        va = vals(ref)
        for mk in names:
            if mk != ref and va and (vb := vals(mk)) and (v := claim_verdict(va, vb, m["scale"]))["n"] >= 2:
                rows.append(claim_line(f.fill(c["text"], label=b.grid.entry(g, mk).label, **when), v, m["digits"]))
    intro = [f.fill(block["intro"]), ""] if "intro" in block else []
    return intro + out + (["", *claim_head(block.get("unit", "points")), *rows] if rows else [])


def _rel_field(b, rest: str) -> str:
    """``rel.raw``: the grid's run folder relative to its root (``..`` where outside)."""
    if rest == "report_stem":  # ``rel.report_stem``: the report's file name less ".md"
        return Path(b.grid.report).stem
    if rest != "raw":
        raise ConfigError(f"table spec: rel.{rest}: rel.raw or rel.report_stem")
    return os.path.relpath(b.raw, b.grid.root)


def _seeds_field(b, rest: str):
    """``seeds.n``: the grid's seed count; ``seeds.few``: fewer than a claim needs (MIN_SEEDS_FOR_CLAIM)."""
    from mmfl.bench.render import MIN_SEEDS_FOR_CLAIM

    return {"n": len(b.grid.seeds), "few": len(b.grid.seeds) < MIN_SEEDS_FOR_CLAIM}[rest]


def _federation_field(b, rest: str) -> str | int:
    """``federation.<group>@<setting>@<method>.holding``: "3× image, 3× audio+image" (the devices per
    modality set, most first); ``.test_rows``: the test split's size (its federation, built once)."""
    from mmfl.bench.spec_facts import _resolved, _split
    from mmfl.data.federation import build_federation

    ref, what = _split(rest)
    key = (id(b), ref)
    if key not in _FEDS:
        _FEDS[key] = build_federation(_resolved(b, ref))
    fed = _FEDS[key]
    if what == "test_rows":
        return len(fed.test)
    combos = Counter("+".join(fed.modalities_of(c)) for c in range(fed.num_clients))
    return ", ".join(f"{v}× {k}" for k, v in sorted(combos.items(), key=lambda x: -x[1]))


_FEDS: dict = {}


def _own_params_field(b, rest: str) -> str:
    """``own_params.<group>@<setting>@<method>``: its resolved algorithm parameters as "k v, ..." less
    those FedAvg's aggregation rule has with FedAvg's default value (what the method adds or changes)."""
    import dataclasses

    from mmfl.algorithms.fedavg import FedAvgParams
    from mmfl.bench.spec_facts import _resolved

    base = FedAvgParams()
    family = {x.name for x in dataclasses.fields(FedAvgParams)}
    p = _resolved(b, rest).algorithm.params
    return ", ".join(f"{k} {v}" for k, v in vars(p).items() if k not in family or v != getattr(base, k))


FIELDS = {"rel": _rel_field, "seeds": _seeds_field, "federation": _federation_field, "own_params": _own_params_field}
KINDS = {"planned_columns": planned_columns, "value_list": value_list, "item_rows": item_rows, "best_vs": best_vs,
         "order_line": order_line, "round_columns": round_columns, "pooled_line": pooled_line, "same_seeds": same_seeds}
KEYS = {"labels", "item", "sep", "items", "planned_only", "sides", "better", "same", "ref_sep", "ref", "early", "need_all",
        "method_line", "item_sep", "keys", "settings", "method", "pairs"}
