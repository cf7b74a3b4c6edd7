"""Target 4: per-round time vs cohort size and vs total number of clients.

    .venv/bin/python benchmarks/perf/scaling.py            # prints both curves, writes scaling.png

Per-round time = the CPU time of the round (local training + aggregation) plus its
checkpoint, median over rounds 2.. (round 1 pays one-off costs) and over ``--repeats``
interleaved repeats of every cell, with the quartiles and the load average
(benchmarks/perf/timing.py; wall time beside it). MOON (it keeps a
previous model per client, so the client-state store and checkpoints are exercised).

- Cohort curve: the issue's workload (100 clients of 600 Fashion-MNIST images each),
  10, 50 and 100 clients per round: should grow linearly.
- Total-clients curve: 10 clients per round, every client holding exactly 6 images
  (``data.train_limit = 6 x clients``, iid), 100, 1,000 and 10,000 clients: the work
  per round is constant, so the time should stay flat (``state_store = auto`` puts the
  1,000- and 10,000-client runs on the disk store, whose checkpoints hold only the
  round's changes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, update_results, workload  # noqa: E402
from timing import Sample, fmt_spread, interleave, measure  # noqa: E402

from mmfl.config import load_config  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402


def per_round(over: list[str], info: dict | None = None) -> list[Sample]:
    """One run; a Sample (CPU, wall) per round from round 2 on: the round plus its checkpoint."""
    exp = Experiment(load_config(None, over), progress=False)
    rounds, ckpts = [], []
    inner, orig = exp.server.round, exp._checkpoint

    def timed_round(rnd, cohort, transport):
        s, row = measure(lambda: inner(rnd, cohort, transport))
        rounds.append(s)
        return row

    def timed_ckpt(rnd):
        ckpts.append(measure(lambda: orig(rnd))[0])

    exp.server.round, exp._checkpoint = timed_round, timed_ckpt
    exp.run(overwrite=True)
    if info is not None:
        info.update(store=type(exp.store).__name__, checkpoint_cpu_s=[c.cpu for c in ckpts[1:]])
    return [Sample(r.cpu + c.cpu, r.wall + c.wall) for r, c in zip(rounds, ckpts)][1:]


def summarize(cmp, name: str, info: dict) -> dict:
    cpu, wall = cmp.cpu(name), cmp.wall(name)
    return {"per_round_s": cpu["median"], "cpu": cpu, "wall": wall, "wall_per_round_s": wall["median"],
            "checkpoint_s": statistics.median(info["checkpoint_cpu_s"]) if info.get("checkpoint_cpu_s") else 0.0,
            "store": info.get("store"), "samples": [[x.cpu, x.wall] for x in cmp.samples[name]]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cohorts", type=int, nargs="*", default=[10, 50, 100])
    ap.add_argument("--totals", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--algorithm", default="moon")
    ap.add_argument("--batch-clients", action="store_true")
    ap.add_argument("--state-store", default="auto", choices=["auto", "memory", "disk"])
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of every cell (default 1)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    common = [f"batch_clients={'true' if a.batch_clients else 'false'}", "data.test_limit=1000",
              f"state_store={a.state_store}"]
    res = {"cohort": {}, "total": {}}
    print(f"{a.algorithm}, {a.rounds} rounds, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}")
    infos = {f"cohort {k}": {} for k in a.cohorts} | {f"total {n}": {} for n in a.totals}
    cells = {f"cohort {k}": (lambda k=k: per_round(workload(f"scaling-cohort{k}", *common, rounds=a.rounds,
                                                              per_round=k, algorithm=a.algorithm), infos[f"cohort {k}"]))
             for k in a.cohorts}
    cells |= {f"total {n}": (lambda n=n: per_round(workload(f"scaling-total{n}", *common, f"data.train_limit={6 * n}",
                                                            rounds=a.rounds, clients=n, per_round=10,
                                                            algorithm=a.algorithm), infos[f"total {n}"]))
              for n in a.totals}
    cmp = interleave(cells, repeats=a.repeats, warmup=0)
    for k in a.cohorts:
        r = res["cohort"][k] = summarize(cmp, f"cohort {k}", infos[f"cohort {k}"])
        print(f"cohort {k:>5d} of 100 clients (600 images each): CPU {fmt_spread(r['cpu'])} s/round "
              f"({r['per_round_s'] / k * 1e3:.0f} ms per client; checkpoint {r['checkpoint_s']:.3f} s; "
              f"wall {r['wall_per_round_s']:.2f} s)", flush=True)
    for n in a.totals:
        r = res["total"][n] = summarize(cmp, f"total {n}", infos[f"total {n}"])
        print(f"total {n:>6d} clients (6 images each), 10 per round: CPU {fmt_spread(r['cpu'], 3)} s/round "
              f"(checkpoint {r['checkpoint_s']:.3f} s, {r['store']}; wall {r['wall_per_round_s']:.3f} s)", flush=True)
    res["load_start"], res["load_end"] = cmp.load_start, cmp.load_end
    c = sorted(res["cohort"])
    if len(c) > 1:
        slope = [res["cohort"][k]["per_round_s"] / k for k in c]
        res["cohort_ms_per_client"] = [s * 1e3 for s in slope]
        print("cohort: ms per client " + ", ".join(f"{k}: {s * 1e3:.0f}" for k, s in zip(c, slope))
              + f" (max/min {max(slope) / min(slope):.2f}; 1.00 = exactly linear)")
    t = sorted(res["total"])
    if len(t) > 1:
        ratio = res["total"][t[-1]]["per_round_s"] / res["total"][t[0]]["per_round_s"]
        res["total_ratio_largest_to_smallest"] = ratio
        print(f"total clients: {t[-1]} vs {t[0]}: {ratio:.2f}x per-round time (1.00 = flat)")
    res.update(algorithm=a.algorithm, threads=torch.get_num_threads(), load_average=os.getloadavg()[0],
               command="python benchmarks/perf/scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    if not a.no_write:
        plot(res, RESULTS / ("scaling.png" if a.state_store == "auto" else f"scaling-{a.state_store}.png"))
        update_results({}, "scaling" if a.state_store == "auto" else f"scaling_{a.state_store}", res)
    return res


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    c = sorted(res["cohort"])
    axes[0].plot(c, [res["cohort"][k]["per_round_s"] for k in c], marker="o")
    axes[0].set_xlabel("clients per round (of 100)")
    axes[0].set_ylabel("seconds per round")
    axes[0].set_title("cohort size")
    t = sorted(res["total"])
    if not c:
        axes[0].set_visible(False)
    axes[1].plot(t, [res["total"][n]["per_round_s"] for n in t], marker="o")
    axes[1].set_xscale("log")
    axes[1].set_ylim(bottom=0)
    axes[1].set_xlabel("total clients (10 per round)")
    axes[1].set_title("total clients")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
