"""A measurement's report as data: ``[[cells.<name>.blocks]]`` of a perf grid rendered from the
measurement's JSON (:mod:`mmfl.bench.perf`), so a committed result regenerates from its data.

A block (table-spec kind ``expr``, the default in a perf grid's report) is ``text`` (a template) or
``rows`` + ``row`` (one line per element of a list, after an optional ``text`` head); the report is
rendered by the table-spec renderer (:mod:`mmfl.bench.spec`), so its other kinds work too. A template's ``{...}`` field is an expression over the data, then an
optional format spec: ``{runs[0].cells.after.cpu.median:.2f}``, ``{before[-1].written / before[0].written:.1f}``,
``{max(after.written) / 1e6:.2f}``. In an expression a dotted name reads a key of a dict and, on a list,
that key of every element (``after.written``: a list); ``[i]`` indexes; ``+ - * / // %`` and the
functions ``min max sum len median range round abs zip spread`` (median, quartiles, min, max of a list) plus ``iqr(spread, digits)`` ("median (q1–q3)"),
``mmr(spread, digits[, fmt])`` ("median (min–max)") and ``pct(x)`` ("24%"), ``items(mapping[, prefix])`` (``key`` / ``value`` rows of the keys
starting with ``prefix``, without it), ``same(a, b)``, ``int``, ``load(measurement)`` ("12.0 → 14.2"); arithmetic on a list is element by element. In a ``rows`` block the element is
``r`` (its keys also as names) and its index ``i``. Format: docs/benchmarks.md "Performance grids".
"""

from __future__ import annotations

import ast
import operator
import statistics
import string
from pathlib import Path

from mmfl.errors import ConfigError

_OPS = {ast.Pow: operator.pow, ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
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


def _load(d: dict) -> str:
    """A measurement's load average, "start → end" (those it has)."""
    return " → ".join(f"{x:.1f}" for x in (d.get("load_start"), d.get("load_end")) if x is not None) or "—"


FUNCS = {"min": min, "max": max, "sum": sum, "len": len, "median": statistics.median, "range": range,
         "round": round, "abs": abs, "zip": lambda *a: [list(x) for x in zip(*a)], "iqr": _iqr, "mmr": _mmr, "spread": lambda v: _spread(v),
         "pct": lambda x: f"{x:.0%}", "int": int, "load": _load, "same": lambda a, b: a == b,
         "items": lambda d, prefix="": [{"key": k[len(prefix):], "value": v} for k, v in d.items() if k.startswith(prefix)]}


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
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:  # over lists: element by element
            op, a, b = _OPS[type(n.op)], ev(n.left), ev(n.right)
            if isinstance(a, list) or isinstance(b, list):
                a, b = (a if isinstance(a, list) else [a] * len(b)), (b if isinstance(b, list) else [b] * len(a))
                return [op(x, y) for x, y in zip(a, b)]
            return op(a, b)
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


def expr(b, block: dict, f) -> list[str]:
    """Table-spec kind ``expr``: ``text`` and/or ``rows`` + ``row`` whose ``{...}`` fields are
    expressions over the JSON document (``b.data``'s top-level names), as the module says."""
    data = b.data
    lines = fill(block["text"], data).split("\n") if "text" in block else []
    if "rows" in block:
        for j, r in enumerate(evaluate(block["rows"], data)):
            lines.append(fill(block["row"], {**data, **(r if isinstance(r, dict) else {}), "r": r, "i": j}))
    return lines


def expr_plot(b, block: dict, f) -> list[str]:
    """Table-spec kind ``expr_plot``: a PNG ``figure`` beside the report, a panel per entry of ``panels``
    (``x``, ``y``: expressions giving lists; ``title``, ``xlabel``, ``ylabel``, ``xlog``, ``y0`` (y from 0));
    its lines: ``text`` (the link), if any. Written only when the report is (``b.out``, the folder)."""
    if getattr(b, "out", None) is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = block["panels"]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
        for ax, p in zip(axes[0], panels):
            ax.plot([float(v) for v in evaluate(p["x"], b.data)], evaluate(p["y"], b.data), marker="o")
            ax.set_xscale("log" if p.get("xlog") else "linear")
            if p.get("y0"):
                ax.set_ylim(bottom=0)
            ax.set(xlabel=p.get("xlabel", ""), ylabel=p.get("ylabel", ""), title=p.get("title", ""))
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(Path(b.out) / block["figure"], dpi=110)
        plt.close(fig)
    return fill(block["text"], b.data).split("\n") if "text" in block else []


KINDS = {"expr": expr, "expr_plot": expr_plot}
KEYS = {"panels"}  # and text, rows, row, when, parts, figure: keys other kinds share


def as_spec(blocks: list[dict]) -> dict:
    """A perf report's blocks as a table spec: a block without ``kind`` (also inside ``parts``) is an
    ``expr`` block; other kinds (``records``, ``each``, ... over ``{data.<path>}``) render as in any spec."""
    def conv(bl):
        if "sep" in bl:  # what perf reports had before they were table specs
            raise ConfigError("perf report: a block's 'sep' is gone: blocks whose lines follow each other are "
                              "the parts of one block (parts = [...])")
        bl = dict(bl)
        if "parts" in bl:
            bl["parts"] = [conv(p) for p in bl["parts"]]
        elif "kind" not in bl:
            bl["kind"] = "expr"
        return bl
    return {"blocks": [conv(bl) for bl in blocks]}


def render_blocks(blocks: list[dict], data: dict, out=None) -> list[str]:
    """The report's lines, rendered by the one table-spec renderer (:class:`mmfl.bench.spec.TableSpec`):
    every block's lines, then one empty line (``parts``: blocks whose lines follow each other);
    ``out``: the report's folder (figures are written there)."""
    from types import SimpleNamespace

    from mmfl.bench.spec import TableSpec

    return TableSpec("perf report", spec=as_spec(blocks)).report(SimpleNamespace(data=data, grid=None, out=out))
