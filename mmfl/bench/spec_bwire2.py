"""Block kinds of a TOML table spec (:mod:`mmfl.bench.spec`) for columns that follow the grid:

- ``planned_columns``: :func:`mmfl.bench.spec_bwireless.setting_columns` over only the settings of
  ``group`` (or ``settings``) where some method has planned runs (a quick grid that leaves settings
  out drops their columns); a ``header`` entry ``{ per_setting = "<template>" }`` becomes one heading
  per such setting, with ``{sinfo.<k>}`` (the setting's info) and ``{setting}`` (its key).

Each kind is ``fn(b, block, f) -> lines`` (docs/benchmarks.md "Table specs")."""

from __future__ import annotations

from mmfl.bench.spec_bwireless import setting_columns


def planned_settings(b, g: str, settings: list[str] | None = None) -> list[str]:
    """The settings of group ``g`` (or ``settings``) with planned runs of some method."""
    return [s for s in settings or b.grid.settings(g) if any(b.names(g, m, s) for m in b.methods(g))]


def planned_columns(b, block: dict, f) -> list[str]:
    g = block["group"]
    settings = planned_settings(b, g, block.get("settings"))
    head = []
    for h in block["header"]:
        if isinstance(h, str):
            head.append(h)
            continue
        head += [f.fill(h["per_setting"], setting=s, sinfo=b.grid.settings(g)[s].info) for s in settings]
    return setting_columns(b, {**block, "settings": settings, "header": [x.replace("{", "{{").replace("}", "}}")
                                                                          for x in head]}, f)


KINDS = {"planned_columns": planned_columns}
KEYS: set = set()
