"""A benchmark grid from a TOML file: groups of settings x methods x seeds, expanded into
named runs (raw configs). Format and semantics: docs/benchmarks.md.

Precedence of config values (later wins): the base config file(s) (``config`` of the
setting, else of the group, else of the grid), the grid's ``set``, the setting's, the
group's, the method's. Each level may ``unset`` dotted keys, ``replace`` whole values
(a table replaced, not merged) and ``set`` leaves (a table value in ``set`` is merged key
by key; dotted keys may be quoted, ``"algorithm.mu" = 1.0``, or nested).

This module is the grid's model and its expansion into runs; reading and checking the file
(:func:`load_grid`) is :mod:`mmfl.bench.gridfile`."""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfl.config_raw import load_raw
from mmfl.errors import ConfigError

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
            raw = merge(raw, load_raw(f))
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
