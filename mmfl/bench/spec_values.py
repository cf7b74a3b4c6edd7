"""What the kinds of :mod:`mmfl.bench.spec_by_setting` put into templates: :class:`V` (a value with
format specs), :class:`Stat` (values over seeds), :class:`Lazy` (a namespace computed on demand),
fields scoped to a setting or a row, and the values of a grid entry by seed."""

from __future__ import annotations

import copy
import fnmatch

import numpy as np

from mmfl.bench.render import ms
from mmfl.errors import ConfigError

# ----------------------------------------------------------------------------- values in templates


class V(dict):
    """A value a template formats: ``{x.a.b}`` walks dicts, lists and attributes (``a|b``: the first
    truthy); format specs: a number's (``.2f``; ``%.1f``: x 100), ``add=1``, ``join=+`` (a list),
    ``?yes|no`` (truthiness), ``pre=TEXT`` (TEXT + the
    value, or nothing when it is None), ``paren`` (a list as `` (a, b)``, nothing when empty),
    ``kv=k1,k2`` (a dict's ``k=v`` of those keys, in the dict's order), ``/SPEC`` (a list joined by
    `` / ``, each item by SPEC; any other spec on a list: joined by ``, ``). None shows as ``—``."""

    def __init__(self, v=None):
        super().__init__()
        self.v = v

    def __contains__(self, k):
        return True

    def __getitem__(self, k):
        if "." in k:  # a dotted path
            node = self
            for part in k.split("."):
                node = node[part]
            return node
        for part in k.split("|"):
            x = self.v.get(part) if isinstance(self.v, dict) else getattr(self.v, part, None)
            if x or part == k.split("|")[-1]:
                return x if isinstance(x, V) else V(x)

    def __bool__(self):  # a number is there (0 too); None, False and empty containers are not
        return bool(self.v) if self.v is None or isinstance(self.v, (bool, str, list, dict)) else True

    def __format__(self, spec):
        v = self.v
        if spec.startswith("add=") and v is not None:
            return str(v + int(spec[4:]))
        if spec.startswith("join="):
            return spec[5:].join(map(str, v or []))
        if spec.startswith("%") and isinstance(v, (int, float)):
            return format(100 * v, spec[1:])
        if spec.startswith("?"):
            yes, _, no = spec[1:].partition("|")
            return yes if v else no
        if spec.startswith("pre="):
            return "" if v is None else spec[4:] + str(v)
        if spec == "paren":
            return f" ({', '.join(map(str, v))})" if v else ""
        if spec.startswith("kv="):
            keys = spec[3:].split(",")
            return ", ".join(f"{k}={x}" for k, x in (v or {}).items() if k in keys)
        if v is None or (isinstance(v, list) and not v and spec.startswith("/")):
            return "—"
        if isinstance(v, list) and spec:
            sep, spec = (" / ", spec[1:]) if spec.startswith("/") else (", ", spec)
            return sep.join(format(x, spec) for x in v)
        return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


class Stat(dict):
    """Values over seeds: ``{s}`` "mean ± std" (one value: the mean), ``{s:ms}`` / ``{s:ms2}``
    :func:`mmfl.bench.render.ms` (1 / 2 digits, "(n/N)" when seeds are missing), ``{s:.1f}`` the
    mean (``%.1f``: x 100), ``{s:ci.3f}`` / ``{s:ci%.1f}`` mean [95% bootstrap CI]; ``{s.mean}``, ``{s.std}``,
    ``{s.n}``; "—" without values; false when empty. Non-finite values are counted apart."""

    def __init__(self, vals: list[float], expected: int = 0):
        self.bad = sum(not np.isfinite(v) for v in vals)  # non-finite values: counted, left out
        vals = [v for v in vals if np.isfinite(v)]
        super().__init__(n=len(vals), mean=float(np.mean(vals)) if vals else None,
                         std=float(np.std(vals)) if vals else None)
        self.vals, self.expected = vals, expected

    def __bool__(self):
        return bool(self.vals)

    def __format__(self, spec):
        if spec.startswith("ci"):
            return self._ci(spec[2:])
        if not self.vals:
            return "—"
        if spec.startswith("%"):
            return format(100 * self["mean"], spec[1:])
        if spec in ("ms", "ms2"):
            return ms(self.vals, self.expected, 2 if spec == "ms2" else 1)
        if not spec:
            return f"{self['mean']:.1f} ± {self['std']:.1f}" if len(self.vals) > 1 else f"{self['mean']:.1f}"
        return format(self["mean"], spec)

    def _ci(self, spec: str) -> str:
        """"mean [lo, hi]": the 95% percentile bootstrap CI of the mean (10,000 resamples of the
        values, generator seed 0); one value: "v (1 seed)"; then the non-finite values left out."""
        k, spec = (100, spec[1:]) if spec.startswith("%") else (1, spec)
        v = np.asarray(self.vals, float)
        if not len(v):
            txt = "—"
        elif len(v) == 1:
            txt = format(k * v[0], spec) + " (1 seed)"
        else:
            means = v[np.random.default_rng(0).integers(0, len(v), size=(10_000, len(v)))].mean(1)
            lo, hi = (format(k * float(np.percentile(means, q)), spec) for q in (2.5, 97.5))
            txt = f"{format(k * v.mean(), spec)} [{lo}, {hi}]"
        return txt + (f" ({self.bad} seed{'s' * (self.bad > 1)} non-finite, left out)" if self.bad else "")


class Lazy(dict):
    """A namespace whose ``{ns.<name>}`` is ``fn(name)``, computed when a template asks."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __contains__(self, k):
        return True

    def __getitem__(self, k):
        if not dict.__contains__(self, k):
            dict.__setitem__(self, k, self.fn(k))
        return dict.__getitem__(self, k)


def scoped(f, **extra):
    """The spec's fields ``f`` with ``extra`` names added (a setting's, a row's)."""
    g = copy.copy(f)
    g._vars = {}
    base = f.lookup
    g.lookup = lambda name, local=None: base(name, {**extra, **(local or {})})
    return g


def _fields(b, f, setting, group=None):
    group = group or next((g for g in b.grid.groups if setting in b.grid.settings(g)), None)
    label = b.grid.settings(group)[setting].label if setting else ""
    return scoped(f, setting=setting or "", setting_label=label,
                  seeds={k: V(g.seeds) for k, g in b.grid.groups.items()})


# ----------------------------------------------------------------------------- reading values


def setting_of(b, group: str, method: str, setting):
    """``setting``, else the one setting an entry is planned in (None: the group's only one)."""
    if setting is None and len(b.grid.settings(group)) > 1:
        e = b.grid.entry(group, method)
        return e.settings[0] if e.settings and len(e.settings) == 1 else None
    return setting


def seed_vals(b, group: str, method: str, setting, key: str, reader: str = "final") -> dict:
    """``{seed: value}`` of one entry; ``key@reader`` overrides the reader (``final_accuracy@summary``);
    a ``key`` with ``*`` is the mean of the final row's keys it matches (``target_cos/*``); from a JSON
    file (``reader = "audit.json"``) ``a/b`` is a nested key, non-finite values kept. An entry the
    grid does not have gives ``{}``."""
    key, _, r = key.partition("@")
    reader = r or reader
    try:
        names = b.names(group, method, setting_of(b, group, method, setting))
    except ConfigError:
        return {}
    if reader.endswith(".json"):
        got = {s: V(b.results.file(n, reader))[key.replace("/", ".")] for s, n in names.items()}
        got = {s: v.v for s, v in got.items()}
        return {s: float(v) for s, v in got.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "*" not in key:
        return b.results.by_seed(names, key, reader, False, b.grid.eval_key)
    out = {}
    for seed, name in names.items():
        r = b.results.final(name, b.grid.eval_key or key) or {}
        got = [v for k, v in r.items() if fnmatch.fnmatchcase(k, key)]
        if got:
            out[seed] = float(np.mean(got))
    return out


def _entries(b, group: str, which) -> list[str]:
    g = b.grid.groups[group]
    if which in ("methods", "extra", "all"):
        return [*(g.methods if which != "extra" else ()), *(g.extra if which != "methods" else ())]
    return [m for m in which if m in g.methods or m in g.extra]


def _label(b, group, method) -> str:
    return b.grid.entry(group, method).label


def _need(b, need, setting) -> bool:
    """True when one condition of ``need`` (a table or a list of them: ``group``, ``key``, ``reader``,
    ``entries`` "methods" (default) | "all" | [keys]) has a value at ``setting``."""
    for c in need if isinstance(need, list) else [need]:
        if c["group"] in b.grid.groups and setting in b.grid.settings(c["group"]) and any(
                seed_vals(b, c["group"], m, setting, c["key"], c.get("reader", "final"))
                for m in _entries(b, c["group"], c.get("entries", "methods"))):
            return True
    return False
