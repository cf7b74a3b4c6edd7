"""A benchmark grid from a TOML file: groups of settings x methods x seeds, expanded into
named runs (raw configs). Format and semantics: docs/benchmarks.md.

Precedence of config values (later wins): the base config file(s) (``config`` of the
setting, else of the group, else of the grid), the grid's ``set``, the setting's, the
group's, the method's. Each level may ``unset`` dotted keys, ``replace`` whole values
(a table replaced, not merged) and ``set`` leaves (a table value in ``set`` is merged key
by key; dotted keys may be quoted, ``"algorithm.mu" = 1.0``, or nested)."""

from __future__ import annotations

import copy
import fnmatch
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfl.errors import ConfigError

GRID_KEYS = {"name", "root", "raw_dir", "report", "tables", "seeds", "workers", "failed_is_done",
             "reuse_finished", "keep_below", "config", "settings", "set", "replace", "unset", "params", "groups", "extends",
             "eval_key", "when"}
WHEN_KEYS = {"groups", "settings", "methods", "seeds", "names", "set", "replace", "unset"}
GROUP_KEYS = {"template", "seeds", "settings", "methods", "extra", "config", "set", "replace", "unset", "label", "like",
              "post"}
ENTRY_KEYS = {"label", "name", "template", "seeds", "config", "set", "replace", "unset", "info", "settings"}
DEFAULT_TEMPLATE = "{group}-{setting}-{method}-s{seed}"


@dataclass
class Overrides:
    set: dict[str, Any] = field(default_factory=dict)  # dotted key -> leaf value
    replace: dict[str, Any] = field(default_factory=dict)  # dotted key -> whole value
    unset: list[str] = field(default_factory=list)

    def apply(self, raw: dict, where: str) -> None:
        for key in self.unset:
            node, last = _parent(raw, key, where, create=False)
            if node is not None:
                node.pop(last, None)
        for key, value in [*self.replace.items(), *self.set.items()]:
            node, last = _parent(raw, key, where, create=True)
            node[last] = copy.deepcopy(value)


@dataclass
class When:
    """A ``[[when]]`` rule: overrides applied, after the method's, to every run that matches
    all of its given keys (group, setting and method keys, seeds, run-name globs)."""
    over: Overrides
    groups: list[str] | None = None
    settings: list[str] | None = None
    methods: list[str] | None = None
    seeds: list[int] | None = None
    names: list[str] | None = None

    def matches(self, group: str, setting: str, method: str, seed: int, name: str) -> bool:
        return ((self.groups is None or group in self.groups) and (self.settings is None or setting in self.settings)
                and (self.methods is None or method in self.methods) and (self.seeds is None or seed in self.seeds)
                and (self.names is None or any(fnmatch.fnmatchcase(name, pat) for pat in self.names)))


@dataclass
class Entry:
    """A method, extra run, or setting of a group."""
    key: str
    label: str
    token: str  # what {method} / {setting} expands to in the run name (``name``, default the key)
    over: Overrides
    seeds: list[int] | None = None
    config: list[Path] | None = None
    template: str | None = None
    info: dict = field(default_factory=dict)  # ``info = { optimizer = "..." }``: free values for the table spec
    settings: list[str] | None = None  # a method or extra run planned only in these of its group's settings


@dataclass
class Group:
    key: str
    label: str
    template: str
    seeds: list[int]
    settings: dict[str, Entry]
    methods: dict[str, Entry]
    extra: dict[str, Entry]
    config: list[Path] | None
    over: Overrides
    post: dict | None = None  # ``{"call": spec function, "writes": file}``: a post-run step of the group's runs


@dataclass
class Run:
    name: str
    group: str
    setting: str
    method: str
    seed: int
    raw: dict
    extra: bool = False  # an extra run (not one of the group's methods)


@dataclass
class Grid:
    path: Path
    name: str
    root: Path
    raw_dir: Path
    report: Path | None
    tables: Path | None
    seeds: list[int]
    workers: int
    failed_is_done: bool
    reuse_finished: bool
    keep_below: str | None
    config: list[Path]
    over: Overrides
    params: dict
    groups: dict[str, Group]
    eval_key: str | None = None  # the key of an evaluated row (the final row); None: the key read
    when: list[When] = field(default_factory=list)

    def methods(self, group: str) -> dict[str, Entry]:
        """The group's methods (rows), in file order: tables iterate over these."""
        return self._group(group).methods

    def settings(self, group: str) -> dict[str, Entry]:
        return self._group(group).settings

    def entry(self, group: str, method: str) -> Entry:
        g = self._group(group)
        if method in g.methods:
            return g.methods[method]
        if method in g.extra:
            return g.extra[method]
        raise ConfigError(f"groups.{group}: no method or extra run {method!r}")

    def _group(self, group: str) -> Group:
        if group not in self.groups:
            raise ConfigError(f"{self.path}: no group {group!r} (groups: {', '.join(self.groups)})")
        return self.groups[group]

    def name_of(self, group: str, method: str, seed: int, setting: str | None = None) -> str:
        g = self._group(group)
        s = g.settings[_one_setting(g, setting)]
        m = self.entry(group, method)
        template = m.template or s.template or g.template
        return template.format(group=group, setting=s.token, method=m.token, seed=seed)

    def names(self, group: str, method: str, setting: str | None = None,
              seeds: list[int] | None = None) -> dict[int, str]:
        """``{seed: run name}`` of one method (and setting) over its planned seeds (or ``seeds``)."""
        g = self._group(group)
        s = _one_setting(g, setting)
        m = self.entry(group, method)
        use = seeds if seeds is not None else _seeds(g, g.settings[s], m)
        return {seed: self.name_of(group, method, seed, s) for seed in use}

    def raw_config(self, group: str, method: str | None = None, setting: str | None = None,
                   seed: int | None = None) -> dict:
        """The raw config of one run (default: the group's first method, setting and seed)."""
        g = self._group(group)
        s = g.settings[_one_setting(g, setting)]
        m = self.entry(group, method) if method else next(iter({**g.methods, **g.extra}.values()))
        seed = seed if seed is not None else _seeds(g, s, m)[0]
        return self._raw(g, s, m, seed)

    def _raw(self, g: Group, s: Entry, m: Entry, seed: int) -> dict:
        files = s.config if s.config is not None else g.config if g.config is not None else self.config
        raw: dict = {}
        for f in files:
            raw = merge(raw, _load_toml(f))
        where = f"groups.{g.key}"
        for over, w in ((self.over, "set"), (s.over, f"{where}.settings.{s.key}"), (g.over, where),
                        (m.over, f"{where}.methods.{m.key}")):
            over.apply(raw, w)
        name = self.name_of(g.key, m.key, seed, s.key)
        for i, rule in enumerate(self.when):
            if rule.matches(g.key, s.key, m.key, seed, name):
                rule.over.apply(raw, f"when[{i}]")
        raw["seed"] = seed
        return raw

    def runs(self, groups: list[str] | None = None, seeds: list[int] | None = None) -> list[Run]:
        """Every planned run, seed by seed (an interrupted benchmark has whole seeds first),
        then group, setting, method, extra run. A name planned twice must be the same config."""
        for g in groups or []:
            self._group(g)
        all_seeds: list[int] = []
        for g in self.groups.values():
            for e in [*g.settings.values(), *g.methods.values(), *g.extra.values(), None]:
                for seed in (e.seeds if e and e.seeds is not None else g.seeds):
                    if seed not in all_seeds:
                        all_seeds.append(seed)
        out: dict[str, Run] = {}
        for seed in all_seeds:
            if seeds is not None and seed not in seeds:
                continue
            for g in self.groups.values():
                if groups and g.key not in groups:
                    continue
                for s in g.settings.values():
                    for m, is_extra in [*((m, False) for m in g.methods.values()),
                                        *((m, True) for m in g.extra.values())]:
                        if seed not in _seeds(g, s, m):
                            continue
                        name = self.name_of(g.key, m.key, seed, s.key)
                        run = Run(name, g.key, s.key, m.key, seed, self._raw(g, s, m, seed), is_extra)
                        if name in out and out[name].raw != run.raw:
                            raise ConfigError(f"{self.path}: run name {name!r} is planned with two different "
                                              f"configs (groups.{out[name].group}.{out[name].method} and "
                                              f"groups.{g.key}.{m.key}); make the name template tell them apart")
                        out.setdefault(name, run)
        return list(out.values())


def _one_setting(g: Group, setting: str | None) -> str:
    if setting is None:
        if len(g.settings) != 1:
            raise ConfigError(f"groups.{g.key}: has settings {', '.join(g.settings)}; name one")
        return next(iter(g.settings))
    if setting not in g.settings:
        raise ConfigError(f"groups.{g.key}: no setting {setting!r}")
    return setting


def _seeds(g: Group, s: Entry, m: Entry) -> list[int]:
    if m.settings is not None and s.key not in m.settings:
        return []
    seeds = m.seeds if m.seeds is not None else s.seeds if s.seeds is not None else g.seeds
    if m.seeds is not None and s.seeds is not None:
        seeds = [x for x in m.seeds if x in s.seeds]
    return seeds


# ----------------------------------------------------------------------------- parsing


def merge(a: dict, b: dict) -> dict:
    """``a`` deep-merged with ``b`` (b wins; tables merged key by key), a new dict."""
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def dotted_get(raw: dict, key: str, default=None):
    node = raw
    for k in key.split("."):
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return node


def _parent(raw: dict, key: str, where: str, create: bool):
    keys = key.split(".")
    node = raw
    for k in keys[:-1]:
        if k not in node:
            if not create:
                return None, None
            node[k] = {}
        node = node[k]
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {key}: {k} is not a table")
    return node, keys[-1]


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _load_toml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None


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
    t = _load_toml(path)
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
    from mmfl.config import parse_override

    path = Path(path)
    t = _read(path)
    for item in sets:
        keys, value = parse_override(item)
        _parent(t, ".".join(keys), f"--grid-set {item!r}", create=True)[0][keys[-1]] = value
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
