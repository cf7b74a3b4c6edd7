"""Issue 17 item 5 (measured as issue 28 item 6 asks): clients trained per second one-by-one vs
stacked vs Flower's Ray simulation, and the share of a round spent in device kernels, on one device.
The cells are data (accelerator.toml: profiles, workloads, optimizers, modes); the report is a table
spec over the measurement's JSON (tables-accelerator.toml).

    .venv/bin/python benchmarks/perf/accelerator.py --device cuda           # the GPU figures
    .venv/bin/python benchmarks/perf/accelerator.py --device cpu --quick    # a small CPU run
    .venv/bin/python benchmarks/perf/accelerator.py --plan                  # list the cells, run nothing
    .venv/bin/python benchmarks/perf/accelerator.py --render-only benchmarks/results/accelerator-cpu.json

Each (workload, algorithm, cohort) runs its modes interleaved ``--repeats`` times (timing.py); every
round after the first is a sample of CPU time (this process plus reaped children) and wall time, and
on CUDA of GPU time (CUDA events, mmfl.bench.roundtime). Clients/s = cohort / the median round CPU
time (GPU time in a table of its own); ratios are ratios of medians. A Flower cell times the whole
simulation (Ray's start-up included) per round. Utilization: round 2 of the largest cohort under
torch.profiler (device-kernel time / wall; on the CPU aten ops' self CPU time / wall).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import tomllib
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's mmfl
from mmfl.bench.perf_runs import memo_federation  # noqa: E402
from timing import Sample, interleave, measure, spread  # noqa: E402

import mmfl  # noqa: E402
from mmfl.bench.roundtime import run_timed  # noqa: E402
from mmfl.bench.spec_data import render_doc  # noqa: E402
from mmfl.core.device import describe, resolve_device  # noqa: E402

CELLS = tomllib.loads((HERE / "accelerator.toml").read_text())
SPEC = HERE / "tables-accelerator.toml"
MODES, WORKLOADS = tuple(CELLS["modes"]), tuple(CELLS["workloads"])


def config(workload: str, algorithm: str, cohort: int, mode: str, a) -> dict:
    """The run config of one cell (a dict, as a TOML file would give it)."""
    w = CELLS["workloads"][workload]
    cfg = copy.deepcopy(CELLS["base"]) | copy.deepcopy({k: v for k, v in w.items() if k != "per_client"}) | {
        "name": f"acc-{workload}-{algorithm}-{cohort}-{mode}", "output_dir": str(a.out_dir), "rounds": a.rounds,
        "eval_every": a.rounds, "clients_per_round": cohort, "device": a.device, "algorithm": {"name": algorithm},
        "partition": {"name": "iid", "num_clients": cohort}, **CELLS["modes"][mode]}
    if w.get("per_client"):
        cfg["data"]["train_limit"] = cohort * a.per_client
    if getattr(a, "fashion", None) and cfg["data"]["name"] == "fashion_mnist":
        cfg["data"]["root"] = a.fashion
    cfg["train"] = CELLS["optimizers"][a.optimizer] | cfg["train"]
    if a.threads:
        cfg["threads"] = a.threads
    if mode == "flower" and a.gpus_per_client:
        cfg["gpus_per_client"] = a.gpus_per_client
    return cfg


def run_cell(cfg: dict, mode: str, a, out: dict) -> list[Sample]:
    """Train one cell; a :class:`Sample` per timed round (round 1 left out); ``out`` collects the
    GPU seconds of those rounds and the last metrics row's stacking fields and accuracy."""
    if mode == "flower":
        from mmfl.flower.simulation import simulate
        from mmfl.report import load_metrics

        conf = mmfl.configure(cfg)
        s, _ = measure(lambda: simulate(conf, overwrite=True, ray_cpus=a.ray_cpus))
        rows = load_metrics(conf.run_dir)
        samples = [Sample(s.cpu / len(rows), s.wall / len(rows))]
    else:
        rows, times, _ = run_timed(cfg, a.dev)
        samples = [Sample(t["cpu"], t["wall"]) for t in times[1:]]
        out.setdefault("gpu_s", []).extend(t["gpu"] for t in times[1:] if t["gpu"] is not None)
    out.update({k: rows[-1].get(k) for k in ("batched_clients", "batched_fallback", "accuracy")})
    return samples


def plan(a) -> list[tuple[str, str, int, str]]:
    return [(w, alg, k, m) for w in a.workloads for alg in a.algorithms for k in a.cohorts for m in a.modes
            if not (m == "flower" and a.flower_cohorts and k not in a.flower_cohorts)]


def parse(argv=None):
    full, quick = CELLS["profiles"]["full"], CELLS["profiles"]["quick"]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (the runs' device setting)")
    ap.add_argument("--quick", action="store_true", help=f"a small CPU run: {quick}")
    ap.add_argument("--cohorts", type=int, nargs="+", help=f"clients per round (default {full['cohorts']})")
    ap.add_argument("--rounds", type=int, help=f"rounds per cell (default {full['rounds']}; round 1 is not timed)")
    ap.add_argument("--per-client", type=int, help=f"cnn: training images per client (default {full['per_client']})")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--algorithms", nargs="+", choices=["fedavg", "moon"], default=["fedavg", "moon"])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--optimizer", choices=list(CELLS["optimizers"]), default="sgd", help="the clients' optimizer")
    ap.add_argument("--flower-cohorts", type=int, nargs="*", help="run Flower only at these cohorts (quick: the smallest)")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1, help="Ray CPUs of the Flower simulation")
    ap.add_argument("--gpus-per-client", type=float, help="Flower on CUDA: GPU share per Ray actor (default 0.1)")
    ap.add_argument("--threads", type=int, help="torch threads (default 1 on the CPU, torch's default on a GPU)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each cell (each: rounds-1 samples)")
    ap.add_argument("--no-profile", action="store_true", help="skip the utilization profile")
    ap.add_argument("--plan", action="store_true", help="build and check every cell's config, run nothing")
    ap.add_argument("--fashion", help="Fashion-MNIST folder (default: the data's own lookup)")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/mmfl-accelerator"), help="run folders")
    ap.add_argument("--write", type=Path, help="report path (default benchmarks/results/accelerator-<device>.md + .json)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render-only", type=Path, metavar="JSON", help="render JSON's report (.md beside it), run nothing")
    a = ap.parse_args(argv)
    if a.render_only:
        return a
    base = quick if a.quick else full
    a.cohorts, a.rounds = a.cohorts or base["cohorts"], a.rounds or base["rounds"]
    a.per_client = a.per_client or base["per_client"]
    if a.flower_cohorts is None:
        a.flower_cohorts = [min(a.cohorts)] if base.get("flower_smallest") else []
    a.dev = resolve_device(a.device)  # a missing accelerator: one ConfigError line
    a.threads = (1 if a.dev.type == "cpu" else 0) if a.threads is None else a.threads
    if a.gpus_per_client is None:
        a.gpus_per_client = 0.1 if a.dev.type == "cuda" else 0.0
    if a.rounds < 2 or a.repeats < 1:
        ap.error("--rounds: at least 2 (round 1 is not timed); --repeats: at least 1")
    return a


def main(argv=None, on_cell=None) -> dict:
    """Measure (or plan, or render); the measurement's record. ``on_cell(record)``: after each cell."""
    a = parse(argv)
    if a.render_only:
        a.render_only.with_suffix(".md").write_text("\n".join(render_doc(SPEC, a.render_only)))
        return json.loads(a.render_only.read_text())
    if a.threads:
        torch.set_num_threads(a.threads)
    cells = plan(a)
    cmd = "python benchmarks/perf/accelerator.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"device {describe(a.dev)}; {len(cells)} cells; threads {torch.get_num_threads()}", flush=True)
    if a.plan:
        for w, alg, k, m in cells:
            print(f"  {w:>10s} {alg:>6s} cohort {k:>4d} {m:>10s}: {mmfl.configure(config(w, alg, k, m, a)).run.name}")
        return {"cells": cells}
    if "flower" in a.modes:
        try:
            import flwr  # noqa: F401
        except ImportError:
            print("flwr is not installed: no Flower cells (pip install 'flwr[simulation]>=1.41,<1.43')")
            cells = [c for c in cells if c[3] != "flower"]
    res = {"device": describe(a.dev), "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python "
           f"{platform.python_version()}", "threads": torch.get_num_threads(), "command": cmd, "repeats": a.repeats,
           "measured": "CPU time per round (self + reaped children), interleaved repeats; GPU time by CUDA events",
           "torch": torch.__version__, "per_client": a.per_client, "rounds": a.rounds, "optimizer": a.optimizer,
           "gpu": torch.cuda.get_device_name(a.dev) if a.dev.type == "cuda" else None,
           "load_start": f"{os.getloadavg()[0]:.1f}", "cells": {}, "utilization": {}}
    memo_federation()  # each repeat reuses the decoded data set (setup is not timed, only slow)
    groups: dict[tuple, list[str]] = {}
    for w, alg, k, m in cells:
        groups.setdefault((w, alg, k), []).append(m)
    loads = []
    for (w, alg, k), modes in groups.items():
        extra = {m: {} for m in modes}
        print(f"{w} {alg} cohort {k}: {' / '.join(modes)} interleaved x{a.repeats}", flush=True)
        cmp = interleave({m: (lambda m=m: run_cell(config(w, alg, k, m, a), m, a, extra[m])) for m in modes},
                         repeats=a.repeats, warmup=0)
        loads += [cmp.load_start, cmp.load_end]
        for m in modes:
            cpu, wall, gpu = cmp.cpu(m), cmp.wall(m), extra[m].pop("gpu_s", [])
            r = {"clients_per_s": k / cpu["median"], "wall_clients_per_s": k / wall["median"], "cpu": cpu,
                 "wall": wall, "samples": [[x.cpu, x.wall] for x in cmp.samples[m]], **extra[m]}
            if gpu:
                r |= {"gpu": spread(gpu), "gpu_clients_per_s": k / spread(gpu)["median"], "gpu_samples": gpu}
            res["cells"][f"{w}|{alg}|{k}|{m}"] = r
            print(f"{w:>10s} {alg:>6s} cohort {k:>4d} {m:>10s}: {r['clients_per_s']:8.1f} clients/s CPU "
                  f"(wall {r['wall_clients_per_s']:.1f})", flush=True)
        if on_cell:
            on_cell(res | {"load_end": f"{os.getloadavg()[0]:.1f}"})
    res["load_range"] = [min(loads), max(loads)] if loads else None
    if not a.no_profile:
        k = max(a.cohorts)
        for w in a.workloads:
            for alg in a.algorithms:
                for m in [x for x in ("one-by-one", "stacked") if x in a.modes]:
                    u = run_timed(config(w, alg, k, m, a), a.dev, profile=1, rounds=2, eval_every=2)[2]
                    res["utilization"][f"{w}|{alg}|{k}|{m}"] = u
                    print(f"utilization {w} {alg} cohort {k} {m}: {u['fraction']:.2f} ({u['what']})", flush=True)
    res["load_end"] = f"{os.getloadavg()[0]:.1f}"
    lines = render_doc(SPEC, res)
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
