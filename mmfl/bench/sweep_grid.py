"""A user's sweep file (``mmfl sweep GRID.toml``) read into a benchmark :class:`Grid`.

The sweep file is the benchmark grid format (docs/benchmarks.md) with a short form for the
common case, one table of runs; a file with ``[groups.*]`` is a benchmark grid, taken as is::

    base = "mmfl/configs/demo.toml"     # the run config (a path or a list, deep-merged; or [base])
    seeds = [0, 1, 2]
    [axes]                              # the cartesian product of these values
    "algorithm.name" = ["fedavg", "fedprox"]
    "partition.beta" = [0.1, 0.5]

Axes under ``algorithm.`` make the methods (the table's columns), the others the settings
(its rows). Named ``[methods.<key>]`` / ``[settings.<key>]`` entries (the benchmark entry
format: ``label``, ``set``, ``replace``, ``unset``, ``seeds``, ...) are crossed with the axes of
their kind. Runs are named ``<setting>-<method>-s<seed>`` (a part that does not vary is left
out) and written to ``raw_dir`` (default: the folder ``<grid file stem>/`` next to the file).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from mmfl.bench.grid import Grid, _flatten, merge
from mmfl.bench.gridfile import _read, grid_from_table
from mmfl.errors import ConfigError

GROUP = "sweep"  # the one group of a short-form sweep file
SWEEP_KEYS = {"base", "axes", "methods", "metrics"}  # the short form's keys (over the grid keys)
METHOD_PREFIX = "algorithm."  # axes under this key are methods (columns), the others settings (rows)


def load_sweep(path: str | Path, out: str | Path | None = None) -> tuple[Grid, list[str] | None]:
    """The grid of a sweep file (short form or benchmark grid) and its ``metrics`` (the table's
    metric keys; None: chosen from what the runs report). ``out``: the folder of the runs (and
    tables) instead of the file's ``raw_dir``. Any error: one :class:`ConfigError`."""
    path = Path(path)
    t = _read(path)
    metrics = t.pop("metrics", None)
    if metrics is not None and (not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics)):
        raise ConfigError(f"{path}: metrics: must be a list of metric names, e.g. [\"accuracy\"]")
    if "groups" in t:
        bad = sorted(set(t) & SWEEP_KEYS)
        if bad:
            raise ConfigError(f"{path}: {bad[0]}: not with [groups] (a benchmark grid names its runs in groups)")
    else:
        t = _short_form(t, path)
    t.setdefault("workers", 1)
    if out is not None:
        t["raw_dir"] = str(Path(out).resolve())
    elif "raw_dir" not in t:
        t["raw_dir"] = str(path.resolve().parent / path.stem)
    return grid_from_table(t, path), metrics


def _short_form(t: dict, path: Path) -> dict:
    """The short form's table as a benchmark grid table with one group."""
    root = Path(t["root"])
    base = t.pop("base", None)
    if isinstance(base, dict):  # an inline [base] config, under the grid's own [set]
        t["set"] = merge(base, t.get("set", {}))
    elif base is not None:
        files = [base] if isinstance(base, str) else base
        if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
            raise ConfigError(f"{path}: base: a config file, a list of them, or a [base] table")
        t["config"] = [str(_base_file(f, root, path)) for f in files]
    elif "config" not in t:
        raise ConfigError(f"{path}: base: required, the run config (e.g. base = \"mmfl/configs/demo.toml\")")
    axes = t.pop("axes", {})
    if not isinstance(axes, dict):
        raise ConfigError(f"{path}: axes: must be a table of dotted keys and value lists")
    axes = _flatten(axes)
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: axes.{key}: must be a non-empty list of values, got {values!r}")
    m_axes = {k: v for k, v in axes.items() if k.startswith(METHOD_PREFIX)}
    s_axes = {k: v for k, v in axes.items() if not k.startswith(METHOD_PREFIX)}
    short = _short_names(list(axes))
    methods = _cross(_named(t.pop("methods", {}), path, "methods"), m_axes, short)
    settings = _cross(_named(t.pop("settings", {}), path, "settings"), s_axes, short)
    parts = [p for p, n in (("{setting}", settings), ("{method}", methods)) if n] or ["run"]
    group = {"template": "-".join([*parts, "s{seed}"]), "methods": methods or {"run": {"name": "run"}}}
    if settings:
        group["settings"] = settings
    t["groups"] = {GROUP: group}
    t.setdefault("name", path.stem)
    return t


def _base_file(f: str, root: Path, path: Path) -> Path:
    """A base config path: relative to the sweep file's folder (``root``), else to the current one."""
    for p in (root / f, Path(f)):
        if p.is_file():
            return p.resolve()
    raise ConfigError(f"{path}: base: {f}: file not found (relative to {root} or the current folder)")


def _named(t, path: Path, kind: str) -> dict[str, dict]:
    if not isinstance(t, dict) or not all(isinstance(v, dict) for v in t.values()):
        raise ConfigError(f"{path}: {kind}: must be [{kind}.<key>] tables, e.g. "
                          f"[{kind}.prox] set = {{ \"algorithm.name\" = \"fedprox\" }}")
    return t


def _cross(named: dict[str, dict], axes: dict[str, list], short: dict[str, str]) -> dict[str, dict]:
    """Entries: each named entry crossed with each combination of the axes' values (the axes'
    values set over the entry's own). ``{}`` when there are neither."""
    if not axes:
        return dict(named)
    combos = [dict(zip(axes, vals)) for vals in itertools.product(*axes.values())]
    out: dict[str, dict] = {}
    for nk, e in (named or {"": {}}).items():
        for combo in combos:
            token = "_".join(x for x in [e.get("name", nk) if nk else "",
                                          *(_token(short[k], v) for k, v in combo.items())] if x)
            label = ", ".join(x for x in [e.get("label", nk) if nk else "",
                                          *(_label(short[k], v) for k, v in combo.items())] if x)
            entry = merge(e, {"label": label, "name": token, "info": {"axes": combo}})
            entry["set"] = {**_flatten(e.get("set", {})), **combo}
            out[token] = entry
    return out


def _short_names(keys: list[str]) -> dict[str, str]:
    """An axis' name in labels and run names: its last part (``beta`` of ``partition.beta``)
    where that is unique among the axes, else the whole dotted key."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _value_text(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, dict):
        return ",".join(f"{k}={_value_text(x)}" for k, x in _flatten(v).items())
    if isinstance(v, list):
        return ",".join(_value_text(x) for x in v)
    return str(v)


def _token(name: str, v) -> str:
    """A run-name part: the value alone for a ``name`` axis (``fedavg``), else name + value
    (``beta0.1``); characters other than letters, digits and ``.+-=,`` become ``_``."""
    text = _value_text(v) if name.endswith("name") else f"{name.rsplit('.', 1)[-1]}{_value_text(v)}"
    return re.sub(r"[^A-Za-z0-9.+=,-]", "_", text)


def _label(name: str, v) -> str:
    return _value_text(v) if name.endswith("name") else f"{name} = {_value_text(v)}"
