"""Reading a benchmark grid file (TOML): ``extends``, ``like``, ``[[when]]`` rules, every table's
keys checked (a bad value is one ``ConfigError`` naming it), paths resolved, into a
:class:`mmfl.bench.grid.Grid` (which expands it into runs). Format: docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from mmfl.bench.grid import DEFAULT_TEMPLATE, Entry, Grid, Group, Overrides, When, _flatten, _parent, merge
from mmfl.config_raw import load_raw
from mmfl.errors import ConfigError

GRID_KEYS = {"name", "root", "raw_dir", "report", "tables", "seeds", "workers", "failed_is_done",
             "reuse_finished", "keep_below", "config", "settings", "set", "replace", "unset", "params", "groups", "extends",
             "eval_key", "when"}
WHEN_KEYS = {"groups", "settings", "methods", "seeds", "names", "set", "replace", "unset"}
GROUP_KEYS = {"template", "seeds", "settings", "methods", "extra", "config", "set", "replace", "unset", "label", "like",
              "post"}
ENTRY_KEYS = {"label", "name", "template", "seeds", "config", "set", "replace", "unset", "info", "settings"}


def _check_keys(table, allowed: set[str], where: str) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    bad = sorted(set(table) - allowed)
    if bad:
        raise ConfigError(f"{where}: unknown key {bad[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _seed_list(v, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{where}: must be a list of integers, got {v!r}")
    return list(v)


def _paths(v, root: Path, where: str) -> list[Path]:
    v = [v] if isinstance(v, str) else v
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}: must be a path or a list of paths, got {v!r}")
    return [root / x for x in v]


def _overrides(t: dict, where: str) -> Overrides:
    for k in ("set", "replace"):
        if not isinstance(t.get(k, {}), dict):
            raise ConfigError(f"{where}.{k}: must be a table of dotted keys")
    unset = t.get("unset", [])
    if not isinstance(unset, list) or not all(isinstance(x, str) for x in unset):
        raise ConfigError(f"{where}.unset: must be a list of dotted keys")
    return Overrides(_flatten(t.get("set", {})), dict(t.get("replace", {})), list(unset))


def _entry(key: str, t, root: Path, where: str) -> Entry:
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: must be a table, e.g. {{ label = \"...\", set = {{ \"algorithm.name\" = \"...\" }} }}")
    _check_keys(t, ENTRY_KEYS, where)
    info = t.get("info", {})
    if not isinstance(info, dict):
        raise ConfigError(f"{where}.info: must be a table")
    only = t.get("settings")
    if only is not None and (not isinstance(only, list) or not all(isinstance(x, str) for x in only)):
        raise ConfigError(f"{where}.settings: must be a list of the group's setting names")
    return Entry(key=key, label=str(t.get("label", key)), token=str(t.get("name", key)),
                 over=_overrides(t, where),
                 seeds=_seed_list(t["seeds"], f"{where}.seeds") if "seeds" in t else None,
                 config=_paths(t["config"], root, f"{where}.config") if "config" in t else None,
                 template=t.get("template"), info=info, settings=only)


def _entries(t, root: Path, where: str) -> dict[str, Entry]:
    """A table of entries; an entry set to ``false`` (by an extending file) is left out."""
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: must be a table of entries")
    return {k: _entry(k, v, root, f"{where}.{k}") for k, v in t.items() if v is not False}


def _like(groups_t: dict, path: Path) -> dict:
    """Groups with ``like = "other"``: the other group's table deep-merged under this one's
    (``settings = [...]`` then names a subset of the other group's own settings, if it has any)."""
    out = {}

    def resolve(gk: str, seen: tuple) -> dict:
        gt = groups_t[gk]
        if not isinstance(gt, dict) or "like" not in gt:
            return gt
        base = gt["like"]
        if not isinstance(base, str) or base not in groups_t:
            raise ConfigError(f"{path}: groups.{gk}.like: no group {base!r}")
        if base in seen:
            raise ConfigError(f"{path}: groups.{gk}.like: a cycle ({' -> '.join((*seen, base))})")
        under = resolve(base, (*seen, base))
        t = merge(under, {k: v for k, v in gt.items() if k != "like"})
        if isinstance(gt.get("settings"), list) and isinstance(under.get("settings"), dict):
            # a subset of the other group's own settings
            bad = [k for k in gt["settings"] if k not in under["settings"]]
            if bad:
                raise ConfigError(f"{path}: groups.{gk}.settings: no setting {bad[0]!r} in groups.{base}")
            t["settings"] = {k: under["settings"][k] for k in gt["settings"]}
        return t

    for gk in groups_t:
        out[gk] = resolve(gk, (gk,))
    return out


def _read(path: Path, seen: tuple = ()) -> dict:
    """A grid file's table, ``extends`` resolved (this file wins), ``root`` and ``tables``
    made absolute relative to the file that names them."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: extends itself")
    t = load_raw(path)
    if not isinstance(t.get("root", ""), str) or not isinstance(t.get("tables", ""), str):
        raise ConfigError(f"{path}: root and tables must be paths (strings)")
    for k in ("root", "tables"):
        if k in t:
            t[k] = str((path.parent / t[k]).resolve())
    if "extends" in t:
        if not isinstance(t["extends"], str):
            raise ConfigError(f"{path}: extends must be a path (string)")
        base = _read(path.parent / t.pop("extends"), (*seen, path))
        t = merge(base, t)
    t.setdefault("root", str(path.parent))
    return t


def _when(rules, path: Path, groups: dict) -> list[When]:
    if not isinstance(rules, list):
        raise ConfigError(f"{path}: when: must be an array of tables ([[when]])")
    out = []
    for i, t in enumerate(rules):
        where = f"{path}: when[{i}]"
        _check_keys(t, WHEN_KEYS, where)
        lists = {}
        for k in ("groups", "settings", "methods", "names"):
            if k in t:
                if not isinstance(t[k], list) or not all(isinstance(x, str) for x in t[k]):
                    raise ConfigError(f"{where}.{k}: must be a list of strings")
                lists[k] = list(t[k])
        for g in lists.get("groups", []):
            if g not in groups:
                raise ConfigError(f"{where}.groups: no group {g!r}")
        if "seeds" in t:
            lists["seeds"] = _seed_list(t["seeds"], f"{where}.seeds")
        out.append(When(over=_overrides(t, where), **lists))
    return out


def load_grid(path: str | Path, sets: list[str] | tuple = ()) -> Grid:
    """Read and check a grid file (any error: :class:`ConfigError` naming the file and field).
    ``sets``: ``"groups.fig4.seeds=[0, 1, 2]"`` values laid over the file (``--grid-set``)."""
    from mmfl.config_raw import parse_override

    path = Path(path)
    t = _read(path)
    for item in sets:
        keys, value = parse_override(item)
        _parent(t, ".".join(keys), f"--grid-set {item!r}", create=True)[0][keys[-1]] = value
    return grid_from_table(t, path)


def grid_from_table(t: dict, path: Path) -> Grid:
    """A grid file's table (``extends`` resolved, ``root`` absolute: :func:`_read`) checked into
    a :class:`Grid` (``path``: the file, named in errors). ``mmfl sweep`` builds its table so."""
    _check_keys(t, GRID_KEYS, str(path))
    root = Path(t["root"])
    for k in ("raw_dir",):
        if not isinstance(t.get(k), str):
            raise ConfigError(f"{path}: {k}: required, a path relative to root")
    seeds = _seed_list(t.get("seeds", [0]), f"{path}: seeds")
    workers = t.get("workers", 2)
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"{path}: workers: must be an integer >= 1, got {workers!r}")
    groups_t = t.get("groups")
    if isinstance(groups_t, dict):  # a group set to false (by an extending file) is left out
        groups_t = {k: v for k, v in groups_t.items() if v is not False}
    if not isinstance(groups_t, dict) or not groups_t:
        raise ConfigError(f"{path}: groups: at least one [groups.<name>] table with methods is required")
    top = t.get("settings", {})
    if not isinstance(top, dict):
        raise ConfigError(f"{path}: settings: must be a table of [settings.<name>] tables")
    top_settings = _entries(top, root, f"{path}: settings")
    eval_key = t.get("eval_key")
    if eval_key is not None and not isinstance(eval_key, str):
        raise ConfigError(f"{path}: eval_key: must be a metric name (string)")
    groups = {}
    for gk, gt in _like(groups_t, path).items():
        where = f"{path}: groups.{gk}"
        _check_keys(gt, GROUP_KEYS, where)
        if not isinstance(gt.get("methods"), dict) or not gt["methods"]:
            raise ConfigError(f"{where}.methods: required, a table of methods")
        settings_t = gt.get("settings")
        if isinstance(settings_t, list):  # names of the grid's [settings.<name>]
            for k in settings_t:
                if k not in top_settings:
                    raise ConfigError(f"{where}.settings: no [settings.{k}] in the grid")
            settings = {k: top_settings[k] for k in settings_t}
        elif isinstance(settings_t, dict) and settings_t:
            settings = _entries(settings_t, root, f"{where}.settings")
        elif settings_t is None:
            settings = dict(top_settings) or {"": _entry("", {}, root, where)}
        else:
            raise ConfigError(f"{where}.settings: a non-empty table of settings or a list of the grid's settings")
        g = Group(
            key=gk, label=str(gt.get("label", gk)), template=str(gt.get("template", DEFAULT_TEMPLATE)),
            seeds=_seed_list(gt["seeds"], f"{where}.seeds") if "seeds" in gt else seeds,
            settings=settings,
            methods=_entries(gt["methods"], root, f"{where}.methods"),
            extra=_entries(gt.get("extra", {}), root, f"{where}.extra"),
            config=_paths(gt["config"], root, f"{where}.config") if "config" in gt else None,
            over=_overrides(gt, where), post=_post(gt.get("post"), f"{where}.post"))
        known = {*top_settings, *(k for t_ in groups_t.values() if isinstance(t_, dict)
                                  and isinstance(t_.get("settings"), dict) for k in t_["settings"])}
        for e in [*g.methods.values(), *g.extra.values()]:  # (a like group may have fewer settings than its entries)
            bad = [x for x in e.settings or [] if x not in known]
            if bad:
                raise ConfigError(f"{where}: {e.key}.settings: no setting {bad[0]!r} in the grid")
        for e in [*g.methods.values(), *g.extra.values(), *g.settings.values()]:
            try:
                (e.template or g.template).format(group=gk, setting="s", method="m", seed=0)
            except (KeyError, IndexError, ValueError) as err:
                raise ConfigError(f"{where}: template {e.template or g.template!r}: bad field {err}") from None
        groups[gk] = g
    return Grid(
        path=path, name=str(t.get("name", path.parent.name)), root=root, raw_dir=root / t["raw_dir"],
        report=root / t["report"] if t.get("report") else None,
        tables=Path(t["tables"]) if t.get("tables") else None,
        seeds=seeds, workers=workers, failed_is_done=bool(t.get("failed_is_done", False)),
        reuse_finished=bool(t.get("reuse_finished", False)), keep_below=t.get("keep_below"),
        config=_paths(t.get("config", []), root, f"{path}: config"), over=_overrides(t, str(path)),
        params=dict(t.get("params", {})), groups=groups, eval_key=eval_key, when=_when(t.get("when", []), path, groups))


def _post(t, where: str) -> dict | None:
    if t is None:
        return None
    if not isinstance(t, dict) or set(t) != {"call", "writes"} or not all(isinstance(v, str) for v in t.values()):
        raise ConfigError(f"{where}: must be {{ call = \"<function of the table spec>\", writes = \"<file>\" }}")
    return dict(t)
