"""Table-spec kinds over a JSON document (a benchmark's measurements, not run folders): the
``{data.<path>}`` fields, format filters and two block kinds, so a report such as
benchmarks/results/perf.md is a ``tables*.toml`` rendered by :func:`render_doc` from its JSON.

- ``{data.a.b.0}``: a path into the document (dict keys, list indices; ``*`` collects every
  value below, missing ones dropped). A missing value is ``None``; formatting ``None`` without a
  filter that takes it is :class:`Missing` (a ``records`` cell shows ``missing``, an ``each``
  entry its ``fallback``).
- Filters ``{field:name/arg}``: ``dash/<spec>`` (``—`` for ``None``), ``else/<text>``,
  ``spread/<digits>`` (``median (q1–q3)``), ``range/<digits>`` (``median (min–max)``), ``load``
  (a record's ``load_start → load_average|load_end``), ``join/<sep>/<spec>``, ``uniq/<sep>``
  (sorted distinct), ``first``, ``items/<sep>/<between>`` (a mapping's ``key value`` pairs).
- ``kind = "records"``: a table, a row per entry of ``source`` (``keys``: these, in this order;
  ``match``: keys matching a regex; ``split`` + ``pivot = n``: keys split, rows grouped by the
  first n parts, ``{col.<rest>}`` the row's entries; ``sort = "natural"``); ``cells`` templates of
  ``{key}``, ``{value}``, ``{k.<i>}`` (the split key), ``{calc.<name>}`` (``calc = {name =
  "{a} / {b}"}``, arithmetic, ``None`` when a field is missing or zero divides); ``$key`` in a
  template is the row's key; ``row.<key> = {cells, missing}`` overrides; ``line = "..."`` renders
  rows as lines instead (a line with a missing value is left out); ``parts = [{...}]`` stacks
  several such row sets under one header. ``keys`` rows are rendered whether or not ``source`` has them.
- ``kind = "each"``: per entry of the mapping ``source`` (``{name}``, ``{r}``; ``last = "runs"``:
  an entry with a list ``runs`` stands for its last run), the blocks of the first ``templates``
  name that prefixes the entry's name (longest first), when the entry has ``need``.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from types import SimpleNamespace


class Missing(KeyError):
    """A field without a value, formatted where no filter takes ``None``."""


def resolve(node, path: str):
    """The value at a dotted ``path`` of JSON data (``None`` when absent; ``*``: every value below)."""
    parts = path.split(".") if path else []
    for i, k in enumerate(parts):
        if k == "*":
            vals = node.values() if isinstance(node, dict) else (node or [])
            rest = ".".join(parts[i + 1:])
            return [v for x in vals if (v := resolve(x, rest)) not in (None, "")]
        if isinstance(node, dict):
            node = node.get(k)
        elif isinstance(node, list) and re.fullmatch(r"-?\d+", k) and -len(node) <= int(k) < len(node):
            node = node[int(k)]
        else:
            return None
        if node is None:
            return None
    return node


def _stat(v, arg: str, lo: str, hi: str) -> str:
    if not v or v.get("median") is None:
        return "—"
    d = int(arg or 2)
    return f"{v['median']:.{d}f} ({v[lo]:.{d}f}–{v[hi]:.{d}f})"


def _load(r, arg: str) -> str:
    a, b = r.get("load_start"), r.get("load_average", r.get("load_end"))
    return " → ".join(f"{x:.1f}" for x in (a, b) if x is not None) or "—"


def _join(v, arg: str) -> str:
    sep, _, spec = arg.partition("/")
    return (sep or ", ").join(format(x, spec) for x in (v or []))


FORMATS = {
    "dash": lambda v, arg: "—" if v is None else format(v, arg),
    "else": lambda v, arg: arg if v is None else format(v, ""),
    "spread": lambda v, arg: _stat(v, arg, "q1", "q3"),
    "range": lambda v, arg: _stat(v, arg, "min", "max"),
    "load": _load,
    "join": _join,
    "uniq": lambda v, arg: (arg or "; ").join(sorted({str(x) for x in v or []})),
    "first": lambda v, arg: "—" if not v else format(v[0], arg),
    "items": lambda v, arg: (arg.partition("/")[0] or ", ").join(
        f"{k}{arg.partition('/')[2] or ' '}{x}" for k, x in (v or {}).items()),
}
FIELDS = {"data": lambda b, rest: resolve(b.data, rest)}


class Scoped(string.Formatter):
    """``f`` (the spec's Fields) with local names (a row, an ``each`` entry) looked up first; a
    missing value formatted without a filter that takes it raises :class:`Missing`."""

    def __init__(self, f, **local):
        super().__init__()
        self.f, self.local = getattr(f, "f", f), {**getattr(f, "local", {}), **local}

    def lookup(self, name: str, local: dict | None = None):
        loc = {**self.local, **(local or {})}
        ns, _, rest = name.partition(".")
        if ns in loc:
            return resolve(loc[ns], rest) if rest else loc[ns]
        return self.f.lookup(name, loc)

    def get_field(self, name, args, kwargs):
        self.field = name
        return self.lookup(name), name

    def format_field(self, value, spec: str):
        name, _, arg = spec.partition("/")
        if name in FORMATS:
            return FORMATS[name](value, arg)
        if value is None:
            raise Missing(repr(self.field))
        return format(value, spec)

    def fill(self, template: str, **local) -> str:
        return Scoped(self, **local).vformat(template, (), {})


def _calc(f: Scoped, exprs: dict) -> dict:
    from mmfl.bench.spec import _arith

    out = {}
    for name, expr in (exprs or {}).items():
        try:
            out[name] = _arith(f.fill(expr))
        except (Missing, ZeroDivisionError):
            out[name] = None
    return out


def _natural(key: str) -> list:
    """Sort key: digit runs compare as numbers (w2 before w10)."""
    return [int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", key))]


def _rows(f: Scoped, part: dict) -> list[tuple[str, object]]:
    src = f.lookup(part["source"]) if "source" in part else None
    keys = list(part["keys"]) if "keys" in part else list(src or {})
    if "match" in part:
        keys = [k for k in keys if re.search(part["match"], k)]
    if part.get("sort") == "natural":
        keys.sort(key=_natural)
    rows = [(k, src.get(k) if isinstance(src, dict) else None) for k in keys]
    if (n := part.get("pivot")) is not None:
        piv: dict = {}
        for k, v in rows:
            head, rest = k.split(part["split"])[:n], k.split(part["split"])[n:]
            piv.setdefault(part["split"].join(head), {})[part["split"].join(rest)] = v
        rows = [(k, cols) for k, cols in piv.items()]
    return rows


def records(b, block: dict, f) -> list[str]:
    """A markdown table: a row per entry of ``source`` (module docstring)."""
    f, head = Scoped(f), block.get("header")
    out = ["| " + " | ".join(f.fill(h) for h in head) + " |", "|" + "---|" * len(head)] if head else []
    for part in block.get("parts") or [block]:
        part = {**{k: v for k, v in block.items() if k != "parts"}, **part}
        for key, value in _rows(f, part):
            sep = part.get("split")
            over = (part.get("row") or {}).get(key, {})
            loc = {"key": key, "value": value, "k": key.split(sep) if sep else [key]}
            if part.get("pivot") is not None:
                loc["col"] = value
            row = Scoped(f, **loc)
            row.local["calc"] = _calc(row, {k: e.replace("$key", key) for k, e in (part.get("calc") or {}).items()})
            if "line" in part:  # a row as a line; a line with a missing value is left out
                try:
                    out.append(row.fill(part["line"].replace("$key", key)))
                except Missing:
                    pass
                continue
            cells = []
            for t in over.get("cells", part.get("cells", [])):
                try:
                    cells.append(row.fill(t.replace("$key", key)))
                except Missing:
                    cells.append(over.get("missing", part.get("missing", "—")))
            out.append("| " + " | ".join(cells) + " |")
    return out


def render_blocks(b, blocks: list[dict], f) -> list[str]:
    """Blocks under ``f``'s scope, as TableSpec.report renders them (each followed by an empty line)."""
    from mmfl.bench.spec import KINDS, when

    out = []
    for bl in blocks:
        if "when" in bl and not when(f, bl["when"]):
            continue
        out += [*(KINDS[bl["kind"]](b, bl, f) if "kind" in bl else f.fill(bl["text"]).split("\n")), ""]
    return out


def each(b, block: dict, f) -> list[str]:
    """Per entry of the mapping ``source``, its template's blocks (module docstring)."""
    f, out = Scoped(f), []
    names = sorted(block["templates"], key=len, reverse=True)
    for name, r in (f.lookup(block["source"]) or {}).items():
        if block.get("last") and isinstance(r, dict) and r.get(block["last"]):
            r = r[block["last"]][-1]
        kind = next((t for t in names if name.startswith(t)), None)
        if kind is None or not isinstance(r, dict) or (block.get("need") and block["need"] not in r):
            continue
        scope = Scoped(f, name=name, r=r)
        try:
            out += render_blocks(b, block["templates"][kind], scope)
        except Missing as e:
            out += [*scope.fill(block["fallback"], error=e.args[0]).split("\n"), ""]
    return out[:-1]


KINDS = {"records": records, "each": each}
KEYS = {"source", "keys", "match", "split", "pivot", "sort", "calc", "parts", "templates", "last", "need", "fallback"}


def render_doc(spec: str | Path, data: dict | str | Path) -> list[str]:
    """The lines of the table spec ``spec`` rendered over the JSON document ``data`` (a dict or a path)."""
    from mmfl.bench.spec import TableSpec

    if not isinstance(data, dict):
        data = json.loads(Path(data).read_text())
    return TableSpec(Path(spec)).report(SimpleNamespace(data=data, grid=None))
