"""Target 5: CreamFL's global-local contrastive aggregation over a public set, chunked.

    .venv/bin/python benchmarks/perf/public_agg.py                      # |P| = 50,000, 10 clients, d = 512
    .venv/bin/python benchmarks/perf/public_agg.py --public 10000       # quicker

Runs in a child process: builds the inputs (10 clients' image representations of the public
set, ``[10, P, 512]`` float32 = 1 GB at P = 50,000, and the global text representations: real
Fashion-MNIST images read through mmfl, ``mmfl.bench.perf_targets.real_rows``), then reads its resident memory, runs
:func:`mmfl.algorithms.public_terms.global_local_contrastive_aggregation` (image side;
the text side is the same computation again) and reports the time and the peak extra
resident memory (peak RSS during the call minus RSS before it; ``ru_maxrss`` and
``/proc/self/status`` VmHWM, which see torch's allocations, unlike tracemalloc).
The full-matrix version of the authors' code would need ``P x P`` floats per client
(10 GB at P = 50,000). ``--repeats`` child processes run one after another
(``benchmarks/perf/timing.py``): the call's CPU time and peak extra memory are reported as
median and spread, with the load average around them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import update_results  # noqa: E402
from timing import Sample, interleave, spread  # noqa: E402

CHILD = r"""
import json, resource, sys, time, torch
from mmfl.algorithms.public_terms import global_local_contrastive_aggregation
C, P, d, chunk, threads = map(int, sys.argv[1:6])
if threads:
    torch.set_num_threads(threads)
from mmfl.bench.perf_targets import real_rows
x = real_rows("fashion_mnist", P, d)  # real images as representations (first d centred pixels, unit norm)
local = x.expand(C, P, d).contiguous()  # every client's the same rows: the arithmetic is the same
glob = x.roll(1, 0).contiguous()
del x

def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

before = rss_kb("VmRSS:")
hwm_before = rss_kb("VmHWM:")
t = time.perf_counter(); c = time.process_time()
img, _ = global_local_contrastive_aggregation(local, glob, chunk=chunk)
wall, cpu = time.perf_counter() - t, time.process_time() - c
peak = max(rss_kb("VmHWM:"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "threads": torch.get_num_threads(),
                  "rss_before_gb": before / 2**20, "peak_rss_gb": peak / 2**20,
                  "peak_extra_gb": (peak - before) / 2**20, "hwm_before_gb": hwm_before / 2**20,
                  "inputs_gb": (local.numel() + glob.numel()) * 4 / 2**30, "output_gb": img.numel() * 4 / 2**30}))
"""


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--public", type=int, default=50_000)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    outs = []

    def call() -> Sample:
        p = subprocess.run([sys.executable, "-c", CHILD, str(a.clients), str(a.public), str(a.dim), str(a.chunk),
                            str(a.threads)], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(p.stderr[-3000:])
        outs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        return Sample(outs[-1]["cpu_seconds"], outs[-1]["seconds"])  # the call alone, inputs excluded
    cmp = interleave({"call": call}, a.repeats, warmup=0, log=None)
    r = dict(outs[-1])
    r.update(cpu=cmp.cpu("call"), wall=cmp.wall("call"), peak_extra=spread(o["peak_extra_gb"] for o in outs),
             cpu_seconds=cmp.cpu("call")["median"], seconds=cmp.wall("call")["median"],
             peak_extra_gb=spread(o["peak_extra_gb"] for o in outs)["median"], repeats=a.repeats,
             load_start=cmp.load_start)
    flops = 2 * a.clients * a.public * a.public * a.dim
    r.update(public=a.public, clients=a.clients, dim=a.dim, chunk=a.chunk, gflops=flops / 1e9,
             gflop_per_s=flops / 1e9 / r["seconds"], cpu_gflop_per_s=flops / 1e9 / r["cpu_seconds"],
             load_average=cmp.load_end,
             full_matrix_gb_per_client=a.public * a.public * 4 / 2**30,
             command="python benchmarks/perf/public_agg.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"|P| = {a.public}, {a.clients} clients, d = {a.dim}, chunk {a.chunk}: CPU {r['cpu_seconds']:.1f} s, "
          f"wall {r['seconds']:.1f} s ({r['gflop_per_s']:.0f} GFLOP/s, {r['threads']} threads); inputs {r['inputs_gb']:.2f} GB, "
          f"peak extra memory {r['peak_extra_gb']:.3f} GB (full matrix: {r['full_matrix_gb_per_client']:.1f} GB "
          "per client)")
    if not a.no_write:
        full = a.public == 50_000 and a.clients == 10 and a.dim == 512
        update_results({"public_agg_peak_extra_gb": round(r["peak_extra_gb"], 3)} if full else {},
                       "public_agg" if full else f"public_agg_{a.public}", r)
    return r


if __name__ == "__main__":
    main()
