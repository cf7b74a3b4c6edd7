"""Issue 17 item 5: clients trained per second, one-by-one vs stacked vs Flower's Ray
simulation, and the share of a round spent in device kernels, on one device.

    .venv/bin/python benchmarks/perf/accelerator.py --device cuda           # the GPU figures
    .venv/bin/python benchmarks/perf/accelerator.py --device cpu --quick    # a small CPU run
    .venv/bin/python benchmarks/perf/accelerator.py --plan                  # list the cells, run nothing

Workloads (real data, many small clients, every client trained every round):

- ``cnn``: MOON's simple CNN (``simple_cnn``) on Fashion-MNIST, ``--per-client`` training
  images per client (iid), batch 32, 1 local epoch, SGD lr 0.01 momentum 0.9;
- ``multimodal``: the multimodal model (one MLP encoder per view, concat fusion) on the UCI
  multiple-features digits (``mfeat``: six paired views, 1,600 training digits split over
  the cohort), same training settings;
- ``--optimizer adam``: Adam lr 1e-3 instead of SGD (both are stacked).

Each (workload, algorithm in {FedAvg, MOON}, cohort) cell is trained three ways through
mmfl's public API (``mmfl.run(config, ...)`` with ``device=...``): ``one-by-one``
(``batch_clients = false``), ``stacked`` (``batch_clients = true``: mmfl.core.batched) and
``flower`` (``mmfl flower simulate``: Flower's Ray simulation, one virtual SuperNode per
client, ``gpus_per_client`` of a GPU per actor on CUDA). Throughput = cohort / the median of
the rounds' training times (``train_time_s`` of metrics.jsonl, round 1 left out: it pays
one-off costs such as Ray's actors and CUDA's kernel loading). Ratios (stacked / one-by-one,
stacked / flower) compare cells measured in this one invocation on this one device.

Utilization: one round of one-by-one and of stacked training under torch.profiler. On CUDA:
the summed duration of the CUDA kernels / the round's wall time. On the CPU, as the
analogue: the summed self CPU time of ``aten::`` operators / the round's wall time (the
share of the round spent computing in PyTorch's kernels rather than in Python and the
framework). The profiler's own overhead lengthens the profiled round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's mmfl
from common import RESULTS, memo_federation  # noqa: E402
from timing import Sample, fmt_spread, interleave, measure  # noqa: E402

import mmfl  # noqa: E402
from mmfl.core.device import describe, resolve_device  # noqa: E402

MODES = ("one-by-one", "stacked", "flower")
WORKLOADS = ("cnn", "multimodal")
FULL = dict(cohorts=[10, 50, 100], rounds=4, per_client=64)
QUICK = dict(cohorts=[10, 50], rounds=3, per_client=64)


def config(workload: str, algorithm: str, cohort: int, mode: str, a) -> dict:
    """The run config of one cell (a dict, as a TOML file would give it)."""
    if workload == "cnn":
        data = {"name": "fashion_mnist", "train_limit": cohort * a.per_client, "test_limit": 500}
        model = {"name": "simple_cnn"}
    else:
        data = {"name": "mfeat"}
        model = {"name": "multimodal", "feat_dim": 64, "mlp_hidden": [128]}
    cfg = {
        "name": f"acc-{workload}-{algorithm}-{cohort}-{mode}", "output_dir": str(a.out_dir), "seed": 0,
        "rounds": a.rounds, "eval_every": a.rounds, "clients_per_round": cohort, "device": a.device,
        "batch_clients": mode == "stacked", "data": data,
        "partition": {"name": "iid", "num_clients": cohort}, "model": model,
        "algorithm": {"name": algorithm},
        "train": ({"optimizer": "sgd", "lr": 0.01, "momentum": 0.9} if a.optimizer == "sgd"
                  else {"optimizer": "adam", "lr": 0.001}) | {"local_epochs": 1, "batch_size": 32},
    }
    if a.threads:
        cfg["threads"] = a.threads
    if mode == "flower" and a.gpus_per_client:
        cfg["gpus_per_client"] = a.gpus_per_client
    return cfg


def run_cell(cfg: dict, mode: str, a, rows_out: dict | None = None) -> list[Sample]:
    """Train one cell; one :class:`Sample` (CPU and wall seconds) per timed round (round 1 left
    out: it pays one-off costs). Simulation cells wrap the server's round; a Flower cell
    times the whole simulation (Ray's start-up included) and divides it by the rounds."""
    if mode == "flower":
        from mmfl.flower.simulation import simulate

        conf = mmfl.configure(cfg)
        s, _ = measure(lambda: simulate(conf, overwrite=True, ray_cpus=a.ray_cpus))
        rows = [json.loads(x) for x in (conf.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        samples = [Sample(s.cpu / len(rows), s.wall / len(rows))]
    else:
        from mmfl.engine.runner import Experiment

        exp = Experiment(mmfl.configure(cfg), progress=False)
        inner, samples = exp.server.round, []

        def timed(rnd, cohort, transport):
            s, row = measure(lambda: inner(rnd, cohort, transport))
            if rnd > 0:
                samples.append(s)
            return row

        exp.server.round = timed
        exp.run(overwrite=True)
        rows = [json.loads(x) for x in (exp.cfg.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    if rows_out is not None:
        rows_out.update({k: rows[-1].get(k) for k in ("batched_clients", "batched_fallback", "accuracy")})
    return samples


def utilization(cfg: dict, dev: torch.device) -> dict:
    """Profile round 2 of ``cfg`` (round 1 pays one-off costs): device-kernel time / wall."""
    from torch.profiler import ProfilerActivity, profile

    from mmfl.engine.runner import Experiment

    exp = Experiment(mmfl.configure(cfg, rounds=2, eval_every=2), progress=False)
    inner, out = exp.server.round, {}

    def profiled(rnd, cohort, transport):
        if rnd != 1:
            return inner(rnd, cohort, transport)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            t, c = time.perf_counter(), time.process_time()
            row = inner(rnd, cohort, transport)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            out["wall_s"], out["cpu_s"] = time.perf_counter() - t, time.process_time() - c
        events = prof.events()
        if dev.type == "cuda":  # kernels are events on the CUDA device (reviewed by reading: no GPU in CI)
            us = sum(e.time_range.elapsed_us() for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            out["what"] = "CUDA kernel time / round wall"
        else:
            us = sum(e.self_cpu_time_total for e in events if e.name.startswith("aten::"))
            out["what"] = ("aten ops' self CPU time / round wall (CPU analogue; the profiler's op times are "
                           "elapsed times, so both sides stretch alike under load)")
        out["kernel_s"] = us / 1e6
        out["fraction"] = out["kernel_s"] / out["wall_s"]
        return row

    exp.server.round = profiled
    exp.run(overwrite=True)
    return out


def plan(a) -> list[tuple[str, str, int, str]]:
    cells = []
    for w in a.workloads:
        for alg in a.algorithms:
            for k in a.cohorts:
                for m in a.modes:
                    if m == "flower" and a.flower_cohorts and k not in a.flower_cohorts:
                        continue
                    cells.append((w, alg, k, m))
    return cells


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (the runs' device setting)")
    ap.add_argument("--quick", action="store_true", help=f"a small CPU run: {QUICK}, Flower at the smallest cohort")
    ap.add_argument("--cohorts", type=int, nargs="+", help=f"clients per round (default {FULL['cohorts']})")
    ap.add_argument("--rounds", type=int, help=f"rounds per cell (default {FULL['rounds']}; round 1 is not timed)")
    ap.add_argument("--per-client", type=int, help=f"cnn: training images per client (default {FULL['per_client']})")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--algorithms", nargs="+", choices=["fedavg", "moon"], default=["fedavg", "moon"])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                    help="the clients' optimizer: sgd (lr 0.01, momentum 0.9) or adam (lr 1e-3, mmfl's default)")
    ap.add_argument("--flower-cohorts", type=int, nargs="*", help="run Flower only at these cohorts (quick: the smallest)")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1, help="Ray CPUs of the Flower simulation")
    ap.add_argument("--gpus-per-client", type=float, help="Flower on CUDA: GPU share per Ray actor (default 0.1)")
    ap.add_argument("--threads", type=int, help="torch threads (default 1 on the CPU, torch's default on a GPU)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="interleaved repeats of each cell (default 3); each gives rounds-1 timed rounds")
    ap.add_argument("--no-profile", action="store_true", help="skip the utilization profile")
    ap.add_argument("--plan", action="store_true", help="build and check every cell's config, run nothing")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/mmfl-accelerator"), help="run folders")
    ap.add_argument("--write", type=Path, help="report path (default benchmarks/results/accelerator-<device>.md + .json)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    base = QUICK if a.quick else FULL
    a.cohorts = a.cohorts or base["cohorts"]
    a.rounds = a.rounds or base["rounds"]
    a.per_client = a.per_client or base["per_client"]
    if a.flower_cohorts is None:
        a.flower_cohorts = [min(a.cohorts)] if a.quick else []
    a.dev = resolve_device(a.device)  # a missing accelerator: one ConfigError line
    if a.threads is None:
        a.threads = 1 if a.dev.type == "cpu" else 0
    if a.gpus_per_client is None:
        a.gpus_per_client = 0.1 if a.dev.type == "cuda" else 0.0
    if a.rounds < 2:
        ap.error("--rounds: at least 2 (round 1 is not timed)")
    if a.repeats < 1:
        ap.error("--repeats: at least 1")
    return a


def ratio(x, y):
    return x / y if x and y else None


def report(res: dict, a, cmd: str) -> list[str]:
    cells = res["cells"]
    lines = ["# Throughput and utilization on one device (issue 17, item 5)", "",
             f"Command: `{cmd}` — every figure below measured in that one invocation.", "",
             f"Device: {res['device']}; machine: {res['machine']}; torch {torch.__version__}, "
             f"{res['threads']} torch thread(s); load average at start {res['load_start']}, at end {res['load_end']}"
             + (f" (over the timed comparisons {res['load_range'][0]:.1f}–{res['load_range'][1]:.1f})"
                if res.get("load_range") else "") + ".", ""]
    if a.dev.type == "cpu":
        lines += ["**GPU figures: still to be measured** (no GPU in this task). On the CPU the issue's targets "
                  "(≥ 10× one-by-one for stacked cohorts of ≥ 50 small clients, ≥ 20× Flower simulation) are "
                  "not expected: stacking batches the arithmetic that a GPU would run in parallel, and this "
                  "CPU's one thread runs it serially either way.", ""]
    lines += [f"Workloads: cnn = MOON's simple CNN on Fashion-MNIST, {a.per_client} images per client; multimodal = "
              "the multimodal model (MLP encoder per view) on mfeat's six views, 1,600 training digits over the "
              f"cohort; batch 32, 1 local epoch, {a.optimizer}, {a.rounds} rounds (round 1 not timed).", "",
              "How measured (benchmarks/perf/timing.py): each round's **CPU time** (this process's threads plus "
              f"reaped child processes), the modes of a cell run interleaved {a.repeats} times, so each figure is "
              f"the median over {a.repeats} × {a.rounds - 1} rounds, with the quartiles (q1–q3) of the round CPU "
              "seconds. Clients/s = cohort / median round CPU time; ratios are ratios of medians. Wall-time "
              "clients/s (secondary: it measures the machine's load too) in the last column. Flower: CPU time of "
              "the whole simulation (Ray's start-up included) per round, counting only the Ray processes the "
              "run waited for, so it is a rough figure.", "",
              "| workload | algorithm | cohort | one-by-one clients/s (round CPU s) | stacked clients/s (round CPU s) "
              "| flower clients/s (round CPU s) | stacked / one-by-one | stacked / flower | wall clients/s "
              "one-by-one / stacked |", "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(w, alg, k) for w, alg, k, _ in (c.split("|") for c in cells)}, key=lambda t: (t[0], t[1], int(t[2])))
    fmt = lambda v, suf="": "—" if v is None else f"{v:.1f}{suf}"  # noqa: E731
    for w, alg, k in keys:
        get = lambda m: cells.get(f"{w}|{alg}|{k}|{m}")  # noqa: E731
        col = lambda c: "—" if c is None else f"{c['clients_per_s']:.1f} ({fmt_spread(c['cpu'], 3)})"  # noqa: E731
        cps = lambda m, key="clients_per_s": (get(m) or {}).get(key)  # noqa: E731
        o, s, f = get("one-by-one"), get("stacked"), get("flower")
        r2 = lambda v: "—" if v is None else f"{v:.2f}×"  # noqa: E731
        lines.append(f"| {w} | {alg} | {k} | {col(o)} | {col(s)} | {col(f)} "
                     f"| {r2(ratio(cps('stacked'), cps('one-by-one')))} | {r2(ratio(cps('stacked'), cps('flower')))} "
                     f"| {fmt(cps('one-by-one', 'wall_clients_per_s'))} / {fmt(cps('stacked', 'wall_clients_per_s'))} |")
    fb = sorted({c["batched_fallback"] for c in cells.values() if c.get("batched_fallback")})
    if fb:
        lines += ["", "Stacking fell back to one-by-one: " + "; ".join(fb)]
    if res["utilization"]:
        what = next(iter(res["utilization"].values()))["what"]
        lines += ["", f"Utilization: {what}, round 2 of the largest cohort under torch.profiler (one round, "
                  "not repeated).", "",
                  "| workload | algorithm | cohort | mode | round CPU (s) | round wall (s) | kernel time (s) | fraction |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, u in res["utilization"].items():
            w, alg, k, m = key.split("|")
            lines.append(f"| {w} | {alg} | {k} | {m} | {u.get('cpu_s', 0):.2f} | {u['wall_s']:.2f} "
                         f"| {u['kernel_s']:.2f} | {u['fraction']:.2f} |")
    return lines + [""]


def main(argv=None) -> dict:
    a = parse(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    cells = plan(a)
    cmd = "python benchmarks/perf/accelerator.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"device {describe(a.dev)}; {len(cells)} cells; threads {torch.get_num_threads()}", flush=True)
    if a.plan:
        for w, alg, k, m in cells:
            conf = mmfl.configure(config(w, alg, k, m, a))  # every config checked
            print(f"  {w:>10s} {alg:>6s} cohort {k:>4d} {m:>10s}: {conf.run.name}")
        return {"cells": cells}
    if "flower" in a.modes:
        try:
            import flwr  # noqa: F401
        except ImportError:
            print("flwr is not installed: no Flower cells (pip install 'flwr[simulation]>=1.41,<1.43')")
            cells = [c for c in cells if c[3] != "flower"]
    res = {"device": describe(a.dev), "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python "
           f"{platform.python_version()}", "threads": torch.get_num_threads(), "command": cmd,
           "repeats": a.repeats, "measured": "CPU time per round (self + reaped children), interleaved repeats",
           "load_start": f"{os.getloadavg()[0]:.1f}", "cells": {}, "utilization": {}}
    memo_federation()  # each repeat reuses the decoded data set (setup is not timed, only slow)
    groups: dict[tuple, list[str]] = {}
    for w, alg, k, m in cells:
        groups.setdefault((w, alg, k), []).append(m)
    loads = []
    for (w, alg, k), modes in groups.items():
        rows = {m: {} for m in modes}
        print(f"{w} {alg} cohort {k}: {' / '.join(modes)} interleaved x{a.repeats}", flush=True)
        cmp = interleave({m: (lambda m=m: run_cell(config(w, alg, k, m, a), m, a, rows[m])) for m in modes},
                         repeats=a.repeats, warmup=0)
        loads += [cmp.load_start, cmp.load_end]
        for m in modes:
            cpu, wall = cmp.cpu(m), cmp.wall(m)
            r = {"clients_per_s": k / cpu["median"], "wall_clients_per_s": k / wall["median"], "cpu": cpu,
                 "wall": wall, "samples": [[x.cpu, x.wall] for x in cmp.samples[m]], **rows[m]}
            res["cells"][f"{w}|{alg}|{k}|{m}"] = r
            print(f"{w:>10s} {alg:>6s} cohort {k:>4d} {m:>10s}: {r['clients_per_s']:8.1f} clients/s CPU "
                  f"(round CPU {fmt_spread(cpu, 3)} s; wall {r['wall_clients_per_s']:.1f} clients/s)", flush=True)
    res["load_range"] = [min(loads), max(loads)] if loads else None
    if not a.no_profile:
        k = max(a.cohorts)
        for w in a.workloads:
            for alg in a.algorithms:
                for m in [x for x in ("one-by-one", "stacked") if x in a.modes]:
                    u = utilization(config(w, alg, k, m, a), a.dev)
                    res["utilization"][f"{w}|{alg}|{k}|{m}"] = u
                    print(f"utilization {w} {alg} cohort {k} {m}: {u['fraction']:.2f} ({u['what']})", flush=True)
    res["load_end"] = f"{os.getloadavg()[0]:.1f}"
    lines = report(res, a, cmd)
    print("\n".join(lines))
    if not a.no_write:
        md = a.write or RESULTS / f"accelerator-{a.dev.type}.md"
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text("\n".join(lines))
        md.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {md} and {md.with_suffix('.json')}")
    return res


if __name__ == "__main__":
    try:
        main()
    except mmfl.errors.MMFLError as e:
        print(f"mmfl: error: {e}", file=sys.stderr)
        sys.exit(2)
