"""CPU user and system time of CreamFL's public-set scores (eq. 4, mmfl/algorithms/public_terms.py),
before and after one logits buffer is reused by every chunk (issue 28, item 7).

"before" = the chunk loop as it was (a fresh ``chunk x |P|`` logits matrix per chunk, then
``torch.logsumexp``'s own ``chunk x |P|`` exponentials: above glibc's mmap threshold, each is a
fresh mapping whose pages fault in and are zeroed by the kernel); "after" =
:func:`mmfl.algorithms.public_terms.global_local_contrastive_scores` (one buffer, ``out=`` and
in-place exponentials). Inputs: unit-norm Gaussian representations (a timing of arithmetic:
only the shapes matter), |P| = 20,000, 2 clients, d = 512, chunk 1,024, one thread. Each
variant runs in the same process, interleaved, ``--repeats`` times; user/system seconds and
minor page faults from ``getrusage`` around each call; medians and ranges. The two give the
same bits (asserted).

    nice -n 10 .venv/bin/python benchmarks/perf/public_terms_cpu.py [--repeats 5] [--write]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "public_terms_cpu.md"
COMMAND = "nice -n 10 .venv/bin/python benchmarks/perf/public_terms_cpu.py --write"


def before(local, glob, chunk):
    """eq. 4 chunked as before: fresh temporaries per chunk."""
    C, P, _ = local.shape
    out = torch.empty(C, P)
    g_t = glob.t()
    for c in range(C):
        for s in range(0, P, chunk):
            e = min(P, s + chunk)
            rows = local[c, s:e]
            logits = rows @ g_t
            positive = (rows * glob[s:e]).sum(-1)
            out[c, s:e] = positive - torch.logsumexp(logits, dim=1)
            del logits
    return out


def timed(fn, *a):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    out = fn(*a)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return out, {"user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
                 "minflt": r1.ru_minflt - r0.ru_minflt}


def main() -> None:
    from mmfl.algorithms.public_terms import global_local_contrastive_scores

    ap = argparse.ArgumentParser()
    ap.add_argument("--public", type=int, default=20000)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    local = torch.nn.functional.normalize(torch.randn(args.clients, args.public, args.dim, generator=g), dim=-1)
    glob = torch.nn.functional.normalize(torch.randn(args.public, args.dim, generator=g), dim=-1)
    fns = {"before": before, "after": lambda a, b, c: global_local_contrastive_scores(a, b, c)}
    runs: dict[str, list[dict]] = {k: [] for k in fns}
    loads = []
    results = {}
    for _ in range(args.repeats):  # interleaved: both variants see the same load
        for name, fn in fns.items():
            results[name], t = timed(fn, local, glob, args.chunk)
            runs[name].append(t)
            loads.append(os.getloadavg()[0])
    assert torch.equal(results["before"], results["after"]), "the buffered scores differ"
    flop = 2 * args.clients * args.public ** 2 * args.dim

    def cell(name, key, fmt="{:.2f}"):
        v = [r[key] for r in runs[name]]
        return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}–{fmt.format(max(v))})"

    lines = ["# CreamFL public-set scores: CPU time with one reused buffer (issue 28, item 7)", "",
             f"Regenerate: `{COMMAND}`.", "",
             f"eq. 4 of `mmfl/algorithms/public_terms.py`, |P| = {args.public:,}, {args.clients} clients, "
             f"d = {args.dim}, chunk {args.chunk:,} ({args.chunk * args.public * 4 / 1e6:.0f} MB of logits a chunk), "
             f"one torch thread; {args.repeats} interleaved repeats, median (min–max); "
             f"load average {min(loads):.0f}–{max(loads):.0f} on 2 cores. {flop:.2e} FLOP of matmul per call. "
             "Same bits before and after (asserted).", "",
             "| variant | user s | system s | system share | minor page faults | GFLOP/s of CPU time |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, what in (("before", "before: fresh logits + exponentials per chunk"),
                       ("after", "after: one buffer, `out=`, in-place exp")):
        share = statistics.median(r["sys"] / (r["user"] + r["sys"]) for r in runs[name])
        gf = statistics.median(flop / (r["user"] + r["sys"]) / 1e9 for r in runs[name])
        lines.append(f"| {what} | {cell(name, 'user')} | {cell(name, 'sys')} | {share:.0%} | "
                     f"{cell(name, 'minflt', '{:.0f}')} | {gf:.1f} |")
    tot = {n: statistics.median(r["user"] + r["sys"] for r in runs[n]) for n in runs}
    lines += ["", f"CPU time (user + system), median: before {tot['before']:.2f} s, after {tot['after']:.2f} s "
              f"({tot['before'] / tot['after']:.2f}x).", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        RESULT.write_text(text)


if __name__ == "__main__":
    main()
