"""Timing that reproduces on a shared machine (issue 28, item 6).

Wall time measures the machine's load as much as the code: at a load average of 30 on two
cores a cell's wall time grows ~15x. CPU time does not: it counts only the seconds this
process (all its threads) and its reaped child processes spent running. So every
performance benchmark measures:

- **CPU time** of a cell: user + system seconds of this process (every thread) and of its
  waited-for child processes (``resource.getrusage``), split into ``user`` and ``sys`` (kernel
  time: page faults, zeroing fresh mappings) with the **minor page faults** beside them; wall
  time (``time.perf_counter()``) is kept as a secondary figure;
- the cells of a comparison **interleaved** (A B, B A, ... for ``repeats`` rounds, after
  ``warmup`` untimed rounds), so a change of load or a cache warming up hits every cell alike;
- per cell the **median and spread** (quartiles and min-max) over the repeats, a ratio of
  medians between cells, and the **load average** (``os.getloadavg()``) at start and end.

A cell may return a :class:`Sample` (or a list of them) to report the time of its own core
(setup excluded); otherwise the whole call is timed. Used by :mod:`mmfl.bench.perf` and the
scripts of benchmarks/perf/.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable


@dataclass
class Sample:
    """One timed call: CPU seconds (self + children) and wall seconds; user / system seconds and
    minor page faults where they were read (None otherwise)."""
    cpu: float
    wall: float
    user: float | None = None
    sys: float | None = None
    minflt: float | None = None


def _usage() -> tuple[float, float, float]:
    """(user s, system s, minor faults) of this process plus its waited-for children."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + b.ru_utime, a.ru_stime + b.ru_stime, a.ru_minflt + b.ru_minflt


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_clock() -> float:
    """CPU seconds of this process (all threads) plus its waited-for children."""
    return time.process_time() + _children_cpu()


class Clock:
    """The clocks a measurement reads; tests replace them with fake ones (``usage`` optional)."""
    cpu: Callable[[], float] = staticmethod(cpu_clock)
    wall: Callable[[], float] = staticmethod(time.perf_counter)
    load: Callable[[], float] = staticmethod(lambda: os.getloadavg()[0])
    usage: Callable[[], tuple[float, float, float]] = staticmethod(_usage)


def measure(fn: Callable[[], object], clock: type[Clock] | Clock = Clock) -> tuple[Sample, object]:
    """Time ``fn()``; returns (its Sample, its return value). A returned Sample replaces the
    outer one (the cell timed its own core)."""
    usage = getattr(clock, "usage", None)
    u0 = usage() if usage else None
    c, w = clock.cpu(), clock.wall()
    out = fn()
    s = Sample(clock.cpu() - c, clock.wall() - w)
    if u0 is not None:
        s.user, s.sys, s.minflt = (b - a for a, b in zip(u0, usage()))
    if isinstance(out, Sample):
        s = out
    return s, out


def spread(values: Iterable[float]) -> dict:
    """Median, quartiles (q1, q3; inclusive method), min and max of ``values``."""
    v = sorted(values)
    if not v:
        return {"n": 0, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    q1, q3 = (statistics.quantiles(v, n=4, method="inclusive")[i] for i in (0, 2)) if len(v) > 1 else (v[0], v[0])
    return {"n": len(v), "median": statistics.median(v), "q1": q1, "q3": q3, "min": v[0], "max": v[-1]}


FIELDS = ("cpu", "wall", "user", "sys", "minflt")


@dataclass
class Comparison:
    """The samples of every cell, in the order they ran, and the load average around them."""
    samples: dict[str, list[Sample]]
    order: list[str] = field(default_factory=list)
    load_start: float | None = None
    load_end: float | None = None

    def cpu(self, name: str) -> dict:
        return spread(s.cpu for s in self.samples[name])

    def wall(self, name: str) -> dict:
        return spread(s.wall for s in self.samples[name])

    def of(self, name: str, what: str) -> dict:
        """:func:`spread` of a Sample field, or ``sys_share`` (system / (user + system) per sample)."""
        if what == "sys_share":
            return spread(s.sys / (s.user + s.sys) for s in self.samples[name]
                          if s.sys is not None and s.user + s.sys > 0)
        return spread(getattr(s, what) for s in self.samples[name] if getattr(s, what) is not None)

    def ratio(self, a: str, b: str, what: str = "cpu") -> float | None:
        """median(a) / median(b) of CPU (or wall) time."""
        x, y = self.of(a, what)["median"], self.of(b, what)["median"]
        return x / y if x and y else None

    def to_dict(self) -> dict:
        cells = {}
        for n, ss in self.samples.items():
            cells[n] = {w: self.of(n, w) for w in (*FIELDS, "sys_share") if self.of(n, w)["n"]}
            cells[n]["samples"] = [[s.cpu, s.wall] for s in ss]
            if ss and ss[0].user is not None:  # user s, system s, minor faults of each sample
                cells[n]["usage"] = [[s.user, s.sys, s.minflt] for s in ss]
        return {"load_start": self.load_start, "load_end": self.load_end, "order": self.order, "cells": cells}


def interleave(cells: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
               clock: type[Clock] | Clock = Clock, log: Callable[[str], None] | None = print) -> Comparison:
    """Run every cell ``warmup`` times untimed, then ``repeats`` times interleaved: repeat r runs
    the cells in order, reversed on odd r (A B, B A, A B, ...), so neither always goes first.
    A cell returning a list of Samples contributes each of them (e.g. one per round)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    names = list(cells)
    res = Comparison({n: [] for n in names}, load_start=clock.load())
    for _ in range(warmup):
        for n in names:
            cells[n]()
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            s, out = measure(cells[n], clock)
            got = out if isinstance(out, list) and out and all(isinstance(x, Sample) for x in out) else [s]
            res.samples[n].extend(got)
            res.order.append(n)
            if log:
                log(f"  repeat {r + 1}: {n}: cpu {statistics.median(x.cpu for x in got):.3f} s, "
                    f"wall {statistics.median(x.wall for x in got):.3f} s")
    res.load_end = clock.load()
    return res


def fmt_spread(d: dict, digits: int = 2) -> str:
    """'median (q1–q3)' of a :func:`spread` dict."""
    if d["median"] is None:
        return "—"
    return f"{d['median']:.{digits}f} ({d['q1']:.{digits}f}–{d['q3']:.{digits}f})"


def fmt_range(d: dict, digits: int = 2) -> str:
    """'median (min–max)' of a :func:`spread` dict."""
    if d["median"] is None:
        return "—"
    return f"{d['median']:.{digits}f} ({d['min']:.{digits}f}–{d['max']:.{digits}f})"
