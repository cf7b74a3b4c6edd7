"""The measurement kinds of a perf grid (:mod:`mmfl.bench.perf`): what a cell measures of its
variants. Each kind is ``fn(cell, params) -> dict`` (JSON data); ``params`` is one entry of the
cell's ``over`` (its sizes), filled into the variants' templates.

- ``cpu``: CPU time, interleaved repeats (:func:`mmfl.bench.timing.interleave`): per variant the
  median and spread of CPU, wall, user and system seconds, minor page faults and the system share,
  the load average around them; ``same = true`` asserts the variants return equal results;
  ``diff = "<variant>"``: each other variant's ``max_abs_diff`` from that one's returned tensor(s) (a
  model's state); ``ratios = [[a, b], ...]``: ``ratios["a/b"]``, the median of the repeat-by-repeat
  CPU (and wall) ratios and min / min; a target returning ``{"samples": [Sample, ...], ...}`` timed itself (e.g. per round):
  those samples count, the rest is the variant's ``result``.
- ``peak_memory`` (``repeats``, interleaved; default 1): each variant in a fresh process: its
  target's setup, then the peak resident memory during the timed call (``VmHWM``, reset through /proc/self/clear_refs) minus the resident
  memory before it; ``same`` compares the calls' returned metrics; ``ratios`` as ``cpu``'s, of the
  peak, the extra memory and the CPU seconds, repeat by repeat.
- ``per_call`` (``repeats`` as ``peak_memory``): an mmfl run per variant, one row per call of the
  ``hook`` function (e.g. ``mmfl.engine.checkpoint:save``): its CPU and wall seconds, the bytes the process wrote during
  it (``wchar``, /proc/self/io), the size of its first argument's folder (``kept``) and the length
  of Experiment attributes named in ``lengths``; with the run's own CPU time and the load average;
- ``value``: each variant's callable called once, what it returns recorded (a size, a quantile).

A variant is a target: ``call = "module:factory"`` (``factory(**args)`` sets up outside the timing
and returns the callable timed), ``python = "code"`` (a fresh ``python -c`` process, its CPU time
read from the waited-for child; ``printed = true``: the CPU seconds it printed last) or ``set``
(+ ``config``): an mmfl run; ``patch = {"module:attr.path" = value}`` sets values for its calls.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from statistics import median
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from string import Template

from mmfl.bench.timing import Sample, cpu_clock, interleave, measure
from mmfl.errors import ConfigError


def resolve(ref: str):
    """``module:attr.path`` -> (owner object, attribute name, value)."""
    mod, _, path = ref.partition(":")
    try:
        obj = importlib.import_module(mod)
        *head, last = path.split(".")
        for h in head:
            obj = getattr(obj, h)
        return obj, last, getattr(obj, last)
    except (ImportError, AttributeError, ValueError):
        raise ConfigError(f"perf grid: cannot find {ref!r} (module:attribute)") from None


@contextlib.contextmanager
def patched(patch: dict):
    old = []
    try:
        for ref, value in patch.items():
            owner, name, prev = resolve(ref)
            old.append((owner, name, prev))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, prev in reversed(old):
            setattr(owner, name, prev)


def _sub(v, params: dict):
    """Fill ``$name`` of params into strings (lists and dicts walked); a string that is exactly
    ``"$name"`` becomes the param itself (its type kept)."""
    if isinstance(v, str) and v.startswith("$") and v[1:] in params:
        return params[v[1:]]
    if isinstance(v, str):
        return Template(v).safe_substitute({k: str(x) for k, x in params.items()})
    if isinstance(v, list):
        return [_sub(x, params) for x in v]
    if isinstance(v, dict):
        return {k: _sub(x, params) for k, x in v.items()}
    return v


SHARED = ("python", "printed", "call", "args", "set", "config", "patch")  # cell keys every variant inherits


def variants(cell: dict, params: dict) -> dict[str, dict]:
    """The cell's variants, each with the cell's shared keys under its own and ``$name`` filled from
    the params (the variant's own ``params`` over the cell's)."""
    out = {}
    for name, v in cell["variants"].items():
        full = {**{k: cell[k] for k in SHARED if k in cell}, **v}
        out[name] = _sub(full, {**params, **v.get("params", {})})
    return out


def _python(code: str, printed: bool):
    def run():
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode:
            raise ConfigError(f"perf grid: a python variant failed: {out.stderr.strip().splitlines()[-1:]}")
        if printed:
            return Sample(float(out.stdout.strip().splitlines()[-1]), time.perf_counter() - t)
    return run


def target(v: dict, params: dict):
    """The callable a variant times (its setup done); ``v`` filled by :func:`variants`."""
    if "python" in v:
        return _python(v["python"], v.get("printed", False))
    if "call" in v:
        return resolve(v["call"])[2](**v.get("args", {}))
    if "set" in v:
        from mmfl.config import load_config
        from mmfl.engine.runner import Experiment

        cfg = load_config(v.get("config"), v["set"])
        return lambda: Experiment(cfg, progress=False).run(overwrite=True)
    raise ConfigError("perf grid: a variant needs call, python or set")


def _patching(fn, patch):
    def run():
        with patched(patch):
            return fn()
    return run


def cpu(cell: dict, params: dict) -> dict:
    fns = {}
    for name, v in variants(cell, params).items():
        with patched(v.get("patch", {})):
            fns[name] = _patching(target(v, params), v.get("patch", {}))
    outs = {}

    def keep(name, fn):
        def run():
            outs[name] = fn()
            if isinstance(outs[name], dict) and "samples" in outs[name]:  # samples timed inside (per round)
                return outs[name]["samples"]
            return outs[name]
        return run
    res = interleave({n: keep(n, f) for n, f in fns.items()}, cell.get("repeats", 3), cell.get("warmup", 1),
                     log=lambda m: print(m, flush=True)).to_dict()
    _same(cell, list(outs.values()))
    for name, out in outs.items():
        if isinstance(out, dict) and "samples" in out:
            res["cells"][name]["result"] = {k: v for k, v in out.items() if k != "samples"}
        if cell.get("diff") and name != cell["diff"]:
            res["cells"][name]["max_abs_diff"] = _max_diff(out, outs[cell["diff"]])
    res["ratios"] = {f"{a}/{b}": _paired(res["cells"][a]["samples"], res["cells"][b]["samples"])
                     for a, b in cell.get("ratios", [])}
    return res


def _paired(a: list, b: list) -> dict:
    """a / b of two variants' (CPU, wall) samples: the median of the repeat-by-repeat ratios (adjacent
    runs share the machine's load) and min / min."""
    return {"cpu": median(x[0] / y[0] for x, y in zip(a, b)), "wall": median(x[1] / y[1] for x, y in zip(a, b)),
            "cpu_min_over_min": min(x[0] for x in a) / min(y[0] for y in b)}


def _max_diff(a, b) -> float:
    """The largest absolute difference of two returned tensors or dicts of tensors (a model's state)."""
    a, b = (a, b) if isinstance(a, dict) else ({"": a}, {"": b})
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _same(cell: dict, outs: list) -> None:
    """``same = true``: the variants returned equal results (tensors: the same bits); ``same = [keys]``:
    equal at these keys of the returned dicts."""
    import torch

    keys = cell.get("same")
    if not keys:
        return
    pick = (lambda o: o) if keys is True else (lambda o: {k: o[k] for k in keys})
    for o in outs[1:]:
        a, b = pick(outs[0]), pick(o)
        if not (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b):
            raise AssertionError(f"perf: the variants of {cell['name']} returned different results")


def _kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ConfigError(f"perf grid: no {field} in /proc/self/status (peak_memory needs Linux)")


def child(spec: str) -> None:
    """A ``peak_memory`` variant in this (fresh) process; prints its JSON line."""
    v, params = json.loads(spec)
    with patched(v.get("patch", {})):
        fn = target(v, params)
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak
        rss = _kb("VmRSS")
        s, out = measure(fn)
        print(json.dumps({"extra_kb": _kb("VmHWM") - rss, "rss_kb": rss, "peak_kb": _kb("VmHWM"), "cpu": s.cpu, "result": out}, default=str))


def _repeated(cell: dict, params: dict, one) -> dict:
    """``one(name, variant) -> dict`` for every variant, ``repeats`` times interleaved (A B, B A, ...):
    per variant the last repeat's fields, with every repeat's under ``repeats`` when there are several."""
    vs, n = variants(cell, params), cell.get("repeats", 1)
    res, got = {"load_start": os.getloadavg()[0], "cells": {}}, {k: [] for k in vs}
    for r in range(n):
        for name in (list(vs) if r % 2 == 0 else list(vs)[::-1]):
            got[name].append(one(name, vs[name]))
    for name, rs in got.items():
        res["cells"][name] = {**rs[-1], **({"repeats": rs} if n > 1 else {})}
    res["load_end"] = os.getloadavg()[0]
    return res


def peak_memory(cell: dict, params: dict) -> dict:
    def one(name, v):
        code = "import sys; from mmfl.bench.perf_measures import child; child(sys.argv[1])"
        p = subprocess.run([sys.executable, "-c", code, json.dumps([v, params])], capture_output=True, text=True)
        if p.returncode:
            raise ConfigError(f"perf grid: {cell['name']}/{name} failed: {p.stderr.strip().splitlines()[-1:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])
    res = _repeated(cell, params, one)
    _same(cell, [c["result"] for c in res["cells"].values()])
    reps = {n: c.get("repeats", [c]) for n, c in res["cells"].items()}
    res["ratios"] = {f"{a}/{b}": {f: median(x[f] / y[f] for x, y in zip(reps[a], reps[b])) for f in ("peak_kb", "extra_kb", "cpu")}
                     for a, b in cell.get("ratios", [])}
    return res


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise ConfigError("perf grid: no wchar in /proc/self/io (per_call needs Linux)")


def du(path) -> int:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def per_call(cell: dict, params: dict) -> dict:
    from mmfl.config import load_config
    from mmfl.engine.runner import Experiment

    def one(name, v):
        rows, box = [], {}
        owner, attr, orig = resolve(cell["hook"])

        def hooked(*a, **k):
            w0, c0, t0 = wchar(), cpu_clock(), time.perf_counter()
            out = orig(*a, **k)
            c, t, w = cpu_clock() - c0, time.perf_counter() - t0, wchar() - w0
            row = {"call": len(rows) + 1, "cpu": c, "wall": t, "written": w}
            if cell.get("kept"):
                row["kept"] = du(a[0])
            if cell.get("round_arg") is not None:
                row["round"] = a[cell["round_arg"]]
            row |= {k: len(getattr(box["exp"], attr_)) for k, attr_ in cell.get("lengths", {}).items()}
            rows.append(row)
            return out
        with tempfile.TemporaryDirectory(prefix="mmfl-perf-") as tmp, patched(v.get("patch", {})):
            cfg = load_config(v.get("config"), [f"output_dir={tmp}", f"name={name}", *v["set"]])
            setattr(owner, attr, hooked)
            try:
                box["exp"] = Experiment(cfg, progress=False)
                s, _ = measure(box["exp"].run)
            finally:
                setattr(owner, attr, orig)
        return {"calls": rows, "run": {"cpu": s.cpu, "wall": s.wall},
                "calls_total": {"cpu": sum(r["cpu"] for r in rows), "wall": sum(r["wall"] for r in rows)}}
    return _repeated(cell, params, one)


def value(cell: dict, params: dict) -> dict:
    """Each variant's target called once, its returned value (a size, a quantile) recorded."""
    return {"cells": {name: target(v, params)() for name, v in variants(cell, params).items()}}


MEASURES = {"cpu": cpu, "peak_memory": peak_memory, "per_call": per_call, "value": value}
