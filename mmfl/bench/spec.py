"""Table specs as data: a benchmark's report described in TOML (``tables = "tables.toml"`` in its
grid) and rendered here, so a benchmark folder holds a grid and a spec instead of table code.

A spec is a list of ``[[blocks]]``, each rendered to lines followed by one empty line:

- ``text``: markdown, ``{...}`` fields filled from the grid and its runs (see :class:`Fields`);
- ``kind = "cells"``: one row per method of a group (``rows = "methods"``, ``"settings*methods"`` or a
  list of keys, then ``extra`` runs), columns from ``cells`` templates; ``{value}`` is the row's
  metric aggregated over seeds (``agg = "seed_cell"``: mean ± std [n seeds], diverged runs noted;
  ``"ms"``: mean ± std (n/N)); ``[blocks.row.<key>]`` overrides a row's ``label`` / ``cells`` and
  adds ``more`` (another metric's mean, formatted into the row as ``{more}``);
- ``kind = "pairs"``: paired differences a − b over seeds (bootstrap CI, ``scipy.stats.ttest_rel``;
  :func:`mmfl.bench.render.pair_row`), a claim made only from 5 paired seeds; or rows of a ``line``
  template, a side's own metric ``key``, ``bootstrap = "shared"`` (one generator for the block);
- ``kind = "rounds_to_reach"``: rounds each method's mean curve needs to reach ``base``'s final value;
- ``kind = "round_rows"``: per method and chosen round, the mean over seeds of metric keys of that row;
- ``kind = "matrix"`` (settings x methods), ``"per_seed"`` (a column per seed), ``"rounds_per_setting"``.

``[section]`` (``file``, ``begin``, ``end``) makes the report a section of another file, written
between two marker lines. The kinds live in :mod:`mmfl.bench.spec_kinds`.

Format and examples: docs/benchmarks.md "Table specs"; benchmarks/moon/tables.toml.
"""

from __future__ import annotations

import string
from pathlib import Path

from mmfl.bench.grid import dotted_get
import importlib

from mmfl.config_raw import load_raw
from mmfl.errors import ConfigError

# Modules of block kinds: each has ``KINDS`` (name -> ``fn(b, block, f) -> lines``) and ``KEYS`` (the
# block keys its kinds read besides the shared ``BLOCK_KEYS``). A new family of kinds is one module
# and one line here.
KIND_MODULES = (
    "mmfl.bench.spec_kinds",
    "mmfl.bench.spec_data",
    "mmfl.bench.spec_paired",
    "mmfl.bench.spec_sweeps",
    "mmfl.bench.spec_verdicts",
    "mmfl.bench.spec_figures",
    "mmfl.bench.spec_claims",
    "mmfl.bench.spec_facts",
    "mmfl.bench.spec_setting_rows",
    "mmfl.bench.spec_planned",
    "mmfl.bench.spec_coefs",
    "mmfl.bench.perf_render",
    "mmfl.bench.spec_by_setting",
    "mmfl.bench.spec_errorbar",
)

BLOCK_KEYS = {"text", "kind", "group", "rows", "extra", "header", "cells", "metric", "row", "pairs", "scale",
              "fail_value", "fail_note", "label_a", "label_b", "base", "exclude", "intro", "methods", "rounds",
              "columns", "digits", "missing", "when", "compare", "per_setting", "setting_head", "diff", "a", "b",
              "metrics", "min_seeds", "per_seed", "per_seed_label", "values", "line", "bootstrap", "seeds_note", "parts"}


def _kinds() -> tuple[dict, set, dict]:
    kinds, keys, fields = {}, set(BLOCK_KEYS), {}
    for name in KIND_MODULES:
        mod = importlib.import_module(name)
        if clash := set(kinds) & set(mod.KINDS):
            raise RuntimeError(f"{name}: kind {sorted(clash)[0]!r} defined twice")
        kinds.update(mod.KINDS)
        keys |= set(getattr(mod, "KEYS", ()))
        fields.update(getattr(mod, "FIELDS", {}))  # more {ns.path} field namespaces: ``ns -> fn(b, rest)``
        FORMATS.update(getattr(mod, "FORMATS", {}))  # {field:name/arg} format filters: fn(value, arg)
    return kinds, keys, fields


FORMATS: dict = {}
KINDS, ALL_KEYS, FIELD_NS = _kinds()


class Fields(string.Formatter):
    """``{ns.path}`` fields of a spec's templates: ``config.<group>.<dotted key>`` (the config of the
    group's first run: first method, setting and seed), ``params.<key>`` (the grid's ``[params]``), ``grid.seeds`` / ``grid.name``
    / ``grid.config`` (its base config files), ``config.<group>@<setting>.<key>`` (a setting's config),
    the namespaces of the kind modules' ``FIELDS``; a list formats through ``"<sep>|<spec>"``,
    ``machine`` (:func:`mmfl.sweep.machine`), ``runs.wall_h`` / ``runs.wall_s`` (the finished runs'
    summed wall time), ``runs.finished`` / ``runs.planned`` (counts), ``vars.<name>`` (the spec's ``[vars]``) and the block's own names (``label``, ``value``...)."""

    def __init__(self, b, spec: dict):
        super().__init__()
        self.b, self.spec, self._vars = b, spec, {}

    def get_field(self, field_name, args, kwargs):
        return self.lookup(field_name, kwargs), field_name

    def lookup(self, name: str, local: dict | None = None):
        local = local or {}
        if name in local:
            return local[name]
        ns, _, rest = name.partition(".")
        if ns in local:
            return dotted_get(local[ns], rest)
        b = self.b
        if ns == "config":  # config.<group>[@<setting>].<key>
            group, _, key = rest.partition(".")
            group, _, setting = group.partition("@")
            cfg = b.config(group, None, setting or next(iter(b.grid.settings(group))))  # its first run's config
            return dotted_get(cfg, key) if key else cfg
        if ns == "params":
            return dotted_get(b.params, rest)
        if ns == "grid":
            raw = b.grid.raw_dir
            shown = raw.relative_to(b.grid.root) if raw.is_relative_to(b.grid.root) else raw
            if rest.startswith("settings."):  # the keys of a group's settings, "20 and 30"
                return " and ".join(b.grid.settings(rest.split(".", 1)[1]))
            if rest == "config":  # the grid's base config files, relative to its root
                return ", ".join(str(Path(p).relative_to(b.grid.root)) for p in b.grid.config)
            return {"seeds": b.grid.seeds, "name": b.grid.name, "raw_dir": str(shown), "raw_name": raw.name}[rest]
        if ns == "machine":
            import mmfl.sweep

            return mmfl.sweep.machine()
        if ns == "runs" and rest in ("wall_h", "wall_s", "finished"):
            done = [r for run in b.runs if (r := b.results.summary(run.name))]
            return {"wall_h": sum(r["wall_time_s"] for r in done) / 3600, "finished": len(done),
                    "wall_s": sum(r["wall_time_s"] for r in done)}[rest]
        if ns == "runs" and rest == "planned":
            return len(b.runs)
        if ns == "vars":
            return self.var(rest)
        if ns in FIELD_NS:
            return FIELD_NS[ns](b, rest)
        raise ConfigError(f"table spec: unknown field {{{name}}}")

    def var(self, name: str):
        """A ``[vars.<name>]``: ``value`` (a field) shown through ``if_false`` when it is falsy (0,
        empty, absent), else through ``else`` (a template of ``{value}``)."""
        if name not in self._vars:
            v = self.spec.get("vars", {}).get(name)
            if v is None:
                raise ConfigError(f"table spec: no [vars.{name}]")
            if "expr" in v:  # arithmetic over fields: "{config.g.data.train_limit} // {config.g.partition.num_clients}"
                self._vars[name] = _arith(self.fill(v["expr"]))
            else:
                val = self.lookup(v["value"])
                self._vars[name] = self.fill(v["if_false"] if not val else v.get("else", "{value}"), value=val)
        return self._vars[name]

    def format_field(self, value, format_spec: str):
        """A kind module's filter ``{field:name/arg}``, a list through ``"<sep>|<spec>"``
        (``{info.paper: / |.1f}``: "52.2 / 52.9"), else Python's format."""
        name, _, arg = format_spec.partition("/")
        if name in FORMATS:
            return FORMATS[name](value, arg)
        if isinstance(value, (list, tuple)) and "|" in format_spec:
            sep, spec = format_spec.split("|", 1)
            return sep.join(format(v, spec) for v in value)
        return super().format_field(value, format_spec)

    def fill(self, template: str, **local) -> str:
        return self.vformat(template, (), local)


def _arith(text: str):
    """The value of ``text``, numbers joined by + - * / // and parentheses (nothing else)."""
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv}

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.left), ev(n.right))
        raise ConfigError(f"table spec: vars.expr: only numbers and + - * / // in {text!r}")
    return ev(ast.parse(text, mode="eval").body)


class TableSpec:
    """A loaded ``tables.toml``; :meth:`report` is what a Python spec's ``report(b)`` was."""

    def __init__(self, path: Path, spec: dict | None = None):
        self.path = path  # ``spec``: the spec itself (``path`` then names it in errors)
        self.spec = load_raw(path) if spec is None else spec
        blocks = self.spec.get("blocks")
        if not isinstance(blocks, list) or not blocks:
            raise ConfigError(f"{path}: a table spec needs [[blocks]]")
        every = [(f"blocks[{i}]", bl) for i, bl in enumerate(blocks)]
        every += [(f"{w}.parts[{j}]", p) for w, bl in list(every) for j, p in enumerate(bl.get("parts", []))]
        for i, bl in every:
            if bad := set(bl) - ALL_KEYS:
                raise ConfigError(f"{path}: {i}: unknown key {sorted(bad)[0]!r}")
            if "kind" in bl and bl["kind"] not in KINDS:
                raise ConfigError(f"{path}: {i}.kind: one of {', '.join(KINDS)}, got {bl['kind']!r}")
            if "kind" not in bl and "text" not in bl and "parts" not in bl:
                raise ConfigError(f"{path}: {i}: needs text, kind or parts")
        self.FILES = tuple(self.spec.get("files", ()))
        hooks = self.spec.get("hooks")  # a file next to the spec, or a module's dotted name (mmfl.bench.split_eval)
        self._hooks = None if hooks is None else hooks if not hooks.endswith(".py") else Path(path).parent / hooks

    def __getattr__(self, name: str):
        """The post-run hooks (``done``, ``post``, a group's ``post.call``): a step of the spec's own
        ``[post.<name>]`` (:meth:`_post_step`), else a function of the Python file or module the
        spec's ``hooks = "probe.py"`` names: what runs after a run is code; the report stays data."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self.__dict__.get("spec", {}).get("post", {}):
            return self._post_step(name)
        if self.__dict__.get("_hooks") is None:
            raise AttributeError(name)
        import importlib.util

        if "_hooks_mod" not in self.__dict__ and isinstance(self._hooks, str):
            self._hooks_mod = importlib.import_module(self._hooks)
        if "_hooks_mod" not in self.__dict__:
            spec = importlib.util.spec_from_file_location(f"mmfl_bench_hooks_{self._hooks.stem}", self._hooks)
            self._hooks_mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self._hooks_mod)
        return getattr(self._hooks_mod, name)

    def _post_step(self, name: str):
        """A post-run step of the spec's ``[post.<name>]`` (``function = "module:fn"``, ``args``,
        ``writes``): ``fn(run_dir, **args)``, its result written as JSON to ``run_dir/<writes>`` when
        given; what a grid group's ``post = { call = "<name>", ... }`` runs."""
        step = self.spec["post"][name]

        def post(raw, cfg, run_dir, exp):
            mod, _, fn = step["function"].partition(":")
            out = getattr(importlib.import_module(mod), fn)(run_dir, **step.get("args", {}))
            if "writes" in step:
                import json

                (Path(run_dir) / step["writes"]).write_text(json.dumps(out, indent=1) + "\n")
        return post

    def report(self, b) -> list[str]:
        f = Fields(b, self.spec)
        out = []
        for bl in self.spec["blocks"]:
            lines = self._lines(b, bl, f)
            out += [*lines, ""] if lines else []  # a block that renders nothing adds nothing
        out += [""] * self.spec.get("blank_end", 0)  # more empty lines at the end of the report
        sec = self.spec.get("section")
        if sec:  # the report is a section of another file, between two marker lines
            out = [sec["begin"], *out, sec["end"]]
            if target := f.lookup(sec["file"]):
                write_section(Path(b.grid.root) / target, out, sec["begin"], sec["end"])
        return out


    def _lines(self, b, bl: dict, f) -> list[str]:
        """A block's lines (none when its ``when`` is false: a field's truth, or with ``not `` its
        falsehood); ``parts = [...]``: blocks whose lines follow each other without an empty line."""
        if "when" in bl and not when(f, bl["when"]):
            return []
        if "parts" in bl:
            return [x for p in bl["parts"] for x in self._lines(b, p, f)]
        return KINDS[bl["kind"]](b, bl, f) if "kind" in bl else f.fill(bl["text"]).split("\n")


def when(f, cond: str) -> bool:
    """A block's ``when``: a field's truth, or with ``not `` its falsehood."""
    neg = cond.startswith("not ")
    return bool(f.lookup(cond[4:] if neg else cond)) != neg


def write_section(path: Path, lines: list[str], begin: str, end: str) -> None:
    """Replace the text between ``begin`` and ``end`` in ``path`` by ``lines`` (markers included);
    append it when the file has no markers yet."""
    old = path.read_text() if path.is_file() else ""
    text = "\n".join(lines)
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)
