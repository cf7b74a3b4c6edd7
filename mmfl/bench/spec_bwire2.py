"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for columns that follow the grid:

- ``planned_columns``: :func:`mmfl.bench.spec_bwireless.setting_columns` over only the settings of
  ``group`` (or ``settings``) where some method has planned runs (a quick grid that leaves settings
  out drops their columns); a ``header`` entry ``{ per_setting = "<template>" }`` becomes one heading
  per such setting, with ``{sinfo.<k>}`` (the setting's info) and ``{setting}`` (its key);
  ``split = "<info key>"``: the rows once per value of the settings' info (in order), each over the
  settings with that value (the headings from the first), ``{split}`` in ``cells`` its
  ``labels`` entry (``labels = { <info value> = "<label>" }``; ``{lab.<k>}``: an info value's label).
- ``value_list``: ``line`` with ``{items}``: per method (``methods``, default the group's) and planned
  setting (``settings``) whose ``metric`` has values, ``item`` (``{label}``, ``{v}``: the values
  aggregated, ``{lab.<k>}``...) joined by ``sep`` (default "; "); nothing without values.
- ``item_rows``: a row per entry of ``items = [{ group, setting, method, <name> = ... }]`` (``planned_only``:
  only entries with planned runs) of ``cells`` templates of the entry's names and ``{v.<name>}``, each
  of ``values = { name = <metric> }`` (:mod:`mmfl.bench.spec_read` metrics; ``method`` / ``setting`` /
  ``group`` read another cell's runs; ``prefix``: one "name value" per key after it, ``:func:_item_value``).

Each kind is ``fn(b, block, f) -> lines`` (docs/benchmarks.md "Table specs")."""

from __future__ import annotations

from mmfl.bench.render import md_table
from mmfl.bench.results import finite
from mmfl.bench.spec_read import _m, value
from mmfl.bench.spec_bwireless import _agg, _metric, by_seed, setting_columns


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
    items = []
    for mk in block.get("methods") or list(b.methods(g)):
        for s in planned_settings(b, g, block.get("settings")):
            if vals := by_seed(b, g, mk, s, m):
                items.append(f.fill(block["item"], label=b.grid.entry(g, mk).label, v=_agg(vals, len(b.names(g, mk, s)), m),
                                    **_local(b, g, s, block)))
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


KINDS = {"planned_columns": planned_columns, "value_list": value_list, "item_rows": item_rows}
KEYS = {"labels", "item", "sep", "items", "planned_only"}
