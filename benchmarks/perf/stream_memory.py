"""Streaming aggregation: peak RSS of FedAvg at full participation, list path vs streaming.

    .venv/bin/python benchmarks/perf/stream_memory.py                  # 10,000 clients, 1 round
    .venv/bin/python benchmarks/perf/stream_memory.py --clients 2000   # quicker

Fashion-MNIST (all 60,000 training images) split iid over ``--clients`` clients, every client
in every round (``clients_per_round = clients``), MOON's simple CNN (75,322 floats: a reply is
294 KB), 1 local epoch, ``--rounds`` rounds, 1 thread. Each variant is a child process (its own
peak RSS, ``ru_maxrss``; ``base`` is its RSS after building the experiment, before round 1):
``stream_aggregation = "off"`` holds the round's replies until the server aggregates them,
``"on"`` hands each reply to the server's fold as it arrives. The variants are interleaved over
``--repeats`` (``benchmarks/perf/timing.py``): peak RSS and the run's CPU time are reported as
median and spread, with the load average around them; the final global models of the two are
compared element by element.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, update_results, workload  # noqa: E402
from timing import Sample, interleave, spread  # noqa: E402

CHILD = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
from mmfl.config import load_config
from mmfl.engine.runner import Experiment

def rss_gb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
cfg = load_config(None, json.loads(sys.argv[1]))
exp = Experiment(cfg, progress=False)
base = rss_gb()
t, c = time.perf_counter(), time.process_time()
exp.run(overwrite=True)
seconds, cpu = time.perf_counter() - t, time.process_time() - c
torch.save(exp.server.state_dict(), sys.argv[2])
rows = [json.loads(x) for x in (exp.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
print(json.dumps({"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "base_rss_gb": base,
                  "seconds": seconds, "cpu_s": cpu, "accuracy": rows[-1].get("accuracy"),
                  "replies": rows[-1].get("clients_replied"), "streamed": rows[-1].get("replies_streamed", 0),
                  "bytes_up": rows[-1]["bytes_up"]}))
"""


def run_variant(mode: str, a, rep: int) -> dict:
    name = f"stream-{mode}"
    over = workload(name, f"stream_aggregation={mode}", "threads=1", "data.test_limit=1000",
                    *([f"data.train_limit={a.train_limit}"] if a.train_limit else []),
                    rounds=a.rounds, clients=a.clients, per_round=a.clients, out=a.out)
    model_path = Path(a.out) / f"{name}-model.pt"
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(over), str(model_path)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        print(p.stderr[-3000:])
        raise SystemExit(f"{name}: failed")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall_s"] = time.perf_counter() - t
    r["model"] = str(model_path)
    r["sample"] = Sample(r["cpu_s"], r["seconds"])  # the run alone (the child's setup excluded)
    print(f"  repeat {rep + 1}: {mode:>3s}: peak RSS {r['peak_rss_gb']:.2f} GB (base {r['base_rss_gb']:.2f} GB), "
          f"run {r['seconds']:.0f} s (cpu {r['cpu_s']:.0f} s), {r['replies']} replies ({r['streamed']} streamed), "
          f"accuracy {r['accuracy']:.4f}", flush=True)
    return r


def compare(path_a: str, path_b: str) -> dict:
    import torch

    a, b = torch.load(path_a), torch.load(path_b)
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    differ = sum(int((a[k] != b[k]).sum()) for k in a)
    return {"max_abs_diff": diff, "elements_differing": differ, "elements": sum(v.numel() for v in a.values())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--train-limit", type=int, default=0, help="training images in all (0: all 60,000)")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--no-write", action="store_true", help="do not update benchmarks/results/perf.json")
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    print(f"FedAvg, {a.clients} clients, all of them in each of {a.rounds} round(s), load {os.getloadavg()[0]:.1f}")
    runs: dict[str, list[dict]] = {"off": [], "on": []}

    def cell(mode):
        def run():
            runs[mode].append(run_variant(mode, a, len(runs[mode])))
            return runs[mode][-1]["sample"]
        return run
    cmp = interleave({m: cell(m) for m in ("off", "on")}, a.repeats, warmup=0, log=None)
    off, on = runs["off"], runs["on"]
    res = {
        "clients": a.clients, "rounds": a.rounds, "repeats": a.repeats,
        "peak_rss_gb": {m: statistics.median(r["peak_rss_gb"] for r in rs) for m, rs in runs.items()},
        "base_rss_gb": {m: statistics.median(r["base_rss_gb"] for r in rs) for m, rs in runs.items()},
        "run_s": {m: statistics.median(r["seconds"] for r in rs) for m, rs in runs.items()},
        "cpu_s": {m: statistics.median(r["cpu_s"] for r in rs) for m, rs in runs.items()},
        "cpu": {m: cmp.cpu(m) for m in runs}, "wall": {m: cmp.wall(m) for m in runs},
        "peak_rss": {m: spread(r["peak_rss_gb"] for r in rs) for m, rs in runs.items()},
        "peak_ratio_off_over_on": statistics.median(x["peak_rss_gb"] / y["peak_rss_gb"] for x, y in zip(off, on)),
        "extra_ratio_off_over_on": statistics.median((x["peak_rss_gb"] - x["base_rss_gb"])
                                                     / (y["peak_rss_gb"] - y["base_rss_gb"]) for x, y in zip(off, on)),
        "time_ratio_on_over_off": statistics.median(y["seconds"] / x["seconds"] for x, y in zip(off, on)),
        "cpu_ratio_on_over_off": statistics.median(y["cpu_s"] / x["cpu_s"] for x, y in zip(off, on)),
        "same_accuracy": all(x["accuracy"] == y["accuracy"] for x, y in zip(off, on)),
        "same_bytes_up": all(x["bytes_up"] == y["bytes_up"] for x, y in zip(off, on)),
        "models": compare(off[-1]["model"], on[-1]["model"]),
        "load_start": cmp.load_start, "load_average": cmp.load_end,
        "command": "python benchmarks/perf/stream_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    pk, bs, rs, cs = res["peak_rss_gb"], res["base_rss_gb"], res["run_s"], res["cpu_s"]
    print("| stream_aggregation | peak RSS | RSS before round 1 | peak - before | run wall | run CPU |")
    print("|---|---|---|---|---|---|")
    for m in ("off", "on"):
        print(f"| {m} | {pk[m]:.2f} GB | {bs[m]:.2f} GB | {pk[m] - bs[m]:.2f} GB | {rs[m]:.0f} s | {cs[m]:.0f} s |")
    print(f"peak RSS off/on {res['peak_ratio_off_over_on']:.2f}x (above the setup: "
          f"{res['extra_ratio_off_over_on']:.1f}x); wall on/off {res['time_ratio_on_over_off']:.2f}x, "
          f"CPU on/off {res['cpu_ratio_on_over_off']:.2f}x; "
          f"same accuracy {res['same_accuracy']}, same bytes up {res['same_bytes_up']}; final models: "
          f"{res['models']['elements_differing']} of {res['models']['elements']} elements differ, "
          f"max |diff| {res['models']['max_abs_diff']:.3g}")
    for r in off + on:
        r.pop("sample")
    print(json.dumps(res))
    if not a.no_write:
        update_results({}, f"stream_memory_{a.clients}", res)
    return res


if __name__ == "__main__":
    main()
