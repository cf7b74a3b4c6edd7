"""Per-round time of an mmfl run, for the performance benchmarks (benchmarks/perf/accelerator.py,
benchmarks/perf/gpu_check.py): each server round's CPU seconds (this process's threads plus
reaped children), wall seconds and, on CUDA, GPU seconds (CUDA events from the round's first to
its last queued kernel, the host synchronized after it); optionally one round under
``torch.profiler``: the share of its wall time spent in device kernels (CUDA) or, on the CPU as
the analogue, in ``aten::`` operators' self CPU time.
"""

from __future__ import annotations

import resource
import time

import torch


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) plus its waited-for children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + r.ru_utime + r.ru_stime


def _kernel_share(prof, cuda: bool) -> tuple[float, str]:
    events = prof.events()
    if cuda:  # kernels are the events on the CUDA device
        us = sum(e.time_range.elapsed_us() for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        return us / 1e6, "CUDA kernel time / round wall"
    us = sum(e.self_cpu_time_total for e in events if e.name.startswith("aten::"))
    return us / 1e6, ("aten ops' self CPU time / round wall (CPU analogue; the profiler's op times are elapsed "
                      "times, so both sides stretch alike under load)")


def time_call(fn, device: str | torch.device = "cpu") -> tuple[object, dict]:
    """``fn()`` once: its result and ``{cpu, wall, gpu}`` seconds (``gpu``: CUDA events from before its
    first to after its last queued kernel, the host synchronized around it; None off CUDA)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    c, w = cpu_seconds(), time.perf_counter()
    out = fn()
    if cuda:
        end.record()
        torch.cuda.synchronize(dev)
    return out, {"cpu": cpu_seconds() - c, "wall": time.perf_counter() - w,
                 "gpu": start.elapsed_time(end) / 1e3 if cuda else None}


def run_timed(cfg: dict, device: str | torch.device, profile: int | None = None,
              **over) -> tuple[list[dict], list[dict], dict]:
    """Train the run config ``cfg`` (``mmfl.api.configure(cfg, **over)``); returns its metrics rows, one
    ``{cpu, wall, gpu}`` per round (:func:`time_call`) and, for round index ``profile``, the profile
    ``{cpu_s, wall_s, kernel_s, fraction, what}`` (that round's times are not in the list)."""
    from mmfl.api import configure
    from mmfl.engine.runner import Experiment
    from mmfl.report import load_metrics

    cuda = torch.device(device).type == "cuda"
    exp = Experiment(configure(cfg, **over), progress=False)
    inner, times, prof_out = exp.server.round, [], {}

    def timed(rnd, cohort, transport):
        call = lambda: inner(rnd, cohort, transport)  # noqa: E731
        if rnd != profile:
            row, t = time_call(call, device)
            times.append(t)
            return row
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as p:
            row, t = time_call(call, device)
        kernel, what = _kernel_share(p, cuda)
        prof_out.update(cpu_s=t["cpu"], wall_s=t["wall"], kernel_s=kernel, fraction=kernel / t["wall"], what=what)
        return row

    exp.server.round = timed
    exp.run(overwrite=True)
    return load_metrics(exp.run_dir), times, prof_out
