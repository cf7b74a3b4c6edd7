"""A measurement's report as data: ``[[cells.<name>.blocks]]`` of a perf grid rendered from the
measurement's JSON (:mod:`mmfl.bench.perf`), so a committed result regenerates from its data.

A block is ``text`` (a template) or ``rows`` + ``row`` (one line per element of a list, after an
optional ``text`` head). A template's ``{...}`` field is an expression over the data, then an
optional format spec: ``{runs[0].cells.after.cpu.median:.2f}``, ``{before[-1].written / before[0].written:.1f}``,
``{max(after.written) / 1e6:.2f}``. In an expression a dotted name reads a key of a dict and, on a list,
that key of every element (``after.written``: a list); ``[i]`` indexes; ``+ - * / // %`` and the
functions ``min max sum len median range round abs zip spread`` (median, quartiles, min, max of a list) plus ``iqr(spread, digits)`` ("median (q1–q3)"),
``mmr(spread, digits[, fmt])`` ("median (min–max)") and ``pct(x)`` ("24%"). In a ``rows`` block the element is
``r`` (its keys also as names) and its index ``i``. Format: docs/benchmarks.md "Performance grids".
"""

from __future__ import annotations

import ast
import operator
import statistics
import string

from mmfl.errors import ConfigError

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg}


def _iqr(d: dict, digits: int = 2) -> str:
    from mmfl.bench.timing import fmt_spread

    return fmt_spread(d, digits)


def _spread(values):
    from mmfl.bench.timing import spread

    return spread(values)


def _mmr(d: dict, digits: int = 2, fmt: str = "") -> str:
    if d.get("median") is None:
        return "—"
    f = fmt or f"{{:.{digits}f}}"
    return f"{f.format(d['median'])} ({f.format(d['min'])}–{f.format(d['max'])})"


FUNCS = {"min": min, "max": max, "sum": sum, "len": len, "median": statistics.median, "range": range,
         "round": round, "abs": abs, "zip": lambda *a: [list(x) for x in zip(*a)], "iqr": _iqr, "mmr": _mmr, "spread": lambda v: _spread(v),
         "pct": lambda x: f"{x:.0%}"}


def _key(obj, name):
    if isinstance(obj, dict):
        if name not in obj:
            raise KeyError(name)
        return obj[name]
    if isinstance(obj, list):
        return [_key(x, name) for x in obj]
    raise KeyError(name)


def evaluate(expr: str, names: dict):
    """The value of ``expr`` over ``names`` (see the module's docstring for what it may use)."""
    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id in names:
                return names[n.id]
            if n.id in FUNCS:
                return FUNCS[n.id]
            raise KeyError(n.id)
        if isinstance(n, ast.Attribute):
            return _key(ev(n.value), n.attr)
        if isinstance(n, ast.Subscript):
            obj, k = ev(n.value), ev(n.slice)
            return obj[str(k)] if isinstance(obj, dict) and str(k) in obj and k not in obj else obj[k]
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.operand))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in FUNCS and not n.keywords:
            return FUNCS[n.func.id](*(ev(a) for a in n.args))
        if isinstance(n, (ast.List, ast.Tuple)):
            return [ev(x) for x in n.elts]
        raise ConfigError(f"perf report: {expr!r}: only names, keys, [i], arithmetic and {', '.join(FUNCS)}")
    try:
        return ev(ast.parse(expr.strip(), mode="eval").body)
    except SyntaxError:
        raise ConfigError(f"perf report: cannot read the expression {expr!r}") from None
    except (KeyError, IndexError, TypeError) as e:
        raise ConfigError(f"perf report: {expr!r}: no {e} in the measurement data") from None


class _Fmt(string.Formatter):
    def get_field(self, field_name, args, kwargs):
        return evaluate(field_name, kwargs), field_name


def fill(template: str, names: dict) -> str:
    return _Fmt().vformat(template, (), names)


def render_blocks(blocks: list[dict], data: dict) -> list[str]:
    """The report's lines: every block's lines; ``sep`` (default one empty line) after each block."""
    out: list[str] = []
    for i, bl in enumerate(blocks):
        if bad := set(bl) - {"text", "rows", "row", "sep", "when"}:
            raise ConfigError(f"perf report: blocks[{i}]: unknown key {sorted(bad)[0]!r}")
        if "when" in bl and not evaluate(bl["when"], data):
            continue
        lines = fill(bl["text"], data).split("\n") if "text" in bl else []
        if "rows" in bl:
            for j, r in enumerate(evaluate(bl["rows"], data)):
                local = {**data, **(r if isinstance(r, dict) else {}), "r": r, "i": j}
                lines.append(fill(bl["row"], local))
        out += lines + bl.get("sep", [""])
    return out
