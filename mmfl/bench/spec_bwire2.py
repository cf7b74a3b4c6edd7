"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for columns that follow the grid:

- ``planned_columns``: :func:`mmfl.bench.spec_bwireless.setting_columns` over only the settings of
  ``group`` (or ``settings``) where some method has planned runs (a quick grid that leaves settings
  out drops their columns); a ``header`` entry ``{ per_setting = "<template>" }`` becomes one heading
  per such setting, with ``{sinfo.<k>}`` (the setting's info) and ``{setting}`` (its key);
  ``split = "<info key>"``: the rows once per value of the settings' info (in order), each over the
  settings with that value (the headings from the first), ``{split}`` in ``cells`` its
  ``split_labels`` entry.

Each kind is ``fn(b, block, f) -> lines`` (docs/benchmarks.md "Table specs")."""

from __future__ import annotations

from mmfl.bench.spec_bwireless import setting_columns


def planned_settings(b, g: str, settings: list[str] | None = None) -> list[str]:
    """The settings of group ``g`` (or ``settings``) with planned runs of some method."""
    return [s for s in settings or b.grid.settings(g) if any(b.names(g, m, s) for m in b.methods(g))]


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
            head += [h] if isinstance(h, str) else [
                f.fill(h["per_setting"], setting=s, sinfo=b.grid.settings(g)[s].info) for s in cols]
        label = block.get("split_labels", {}).get(val, val)
        cells = [c.replace("{split}", str(label)) if isinstance(c, str) else c for c in block["cells"]]
        lines = setting_columns(b, {**block, "settings": cols, "cells": cells,
                                    "header": [x.replace("{", "{{").replace("}", "}}") for x in head]}, f)
        out += lines if not out else lines[2:]
    return out


KINDS = {"planned_columns": planned_columns}
KEYS = {"split_labels"}
