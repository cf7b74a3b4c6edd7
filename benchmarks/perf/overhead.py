"""Target 1: mmfl's in-process simulator vs a plain PyTorch loop doing the same work.

    .venv/bin/python benchmarks/perf/overhead.py                 # 3 interleaved repeats
    .venv/bin/python benchmarks/perf/overhead.py --profile       # + cProfile of one mmfl run

Both sides train the same clients on the same batches (the plain loop gets mmfl's
partition, cohorts and shuffling seeds, computed outside the timing) and evaluate the
final model once on the 10,000 test images; the script checks that they end at the
same model. mmfl's time is ``Experiment(cfg)`` (data set already decoded) plus
``run()``: the round loop, byte accounting, metrics, checkpoints, summary and plot.
The plain loop's time is its training, averaging and evaluation.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Timer, interleaved, json_runs, load_average, memo_federation, paired_ratios,  # noqa: E402
                    plain_fedavg, plain_inputs, record_run, summary, workload)

from mmfl.config import load_config  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--partition", default="iid")
    ap.add_argument("--profile", action="store_true", help="cProfile one mmfl run and print where time goes")
    ap.add_argument("--no-write", action="store_true", help="do not update benchmarks/results/perf.json")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    memo_federation()
    over = workload("overhead", "batch_clients=false", rounds=a.rounds, partition=a.partition)
    cfg = load_config(None, over)
    probe = Experiment(cfg, progress=False)  # decodes the data set once (memoized)
    inputs = plain_inputs(probe)
    print(f"workload: {' '.join(over)}\nthreads: {torch.get_num_threads()}, load average {load_average():.1f}")

    last = {}

    def mmfl_run():
        exp = Experiment(cfg, progress=False)  # fresh server and client state; data already decoded
        with Timer() as t:
            exp.run(overwrite=True)
        last["mmfl"] = exp
        return t

    def plain_run():
        glob, acc = plain_fedavg(**inputs)
        last["plain"] = (glob, acc)

    load_start = load_average()
    print("warm-up (imports, allocator, first optimizer) ...", flush=True)
    mmfl_run(), plain_run()
    times = interleaved({"mmfl": mmfl_run, "plain": plain_run}, a.repeats)
    mine = last["mmfl"].server.model.state_dict()
    ref = last["plain"][0].state_dict()
    diff = max(float((mine[k] - ref[k]).abs().max()) for k in mine)
    ratios = paired_ratios(times["mmfl"], times["plain"])
    res = {"mmfl": summary(times["mmfl"]), "plain": summary(times["plain"]), "ratio": ratios,
           "final_model_max_abs_diff": diff, "threads": torch.get_num_threads(), "repeats": a.repeats,
           "load_start": load_start, "load_average": load_average(), "command": "python benchmarks/perf/overhead.py " + " ".join(argv or sys.argv[1:])}
    for side in ("mmfl", "plain"):
        r = res[side]
        print(f"{side:<6s}: CPU median {r['cpu_median']:.2f} s (q1-q3 {r['cpu_q1']:.2f}-{r['cpu_q3']:.2f}); "
              f"wall median {r['wall_median']:.2f} s (min {r['wall_min']:.2f})")
    print(f"ratio mmfl/plain: CPU {ratios['cpu_median_of_pairs']:.3f} (median of pairs), "
          f"{res['mmfl']['cpu_median'] / res['plain']['cpu_median']:.3f} (ratio of medians); wall "
          f"{ratios['wall_median_of_pairs']:.3f} (median of pairs); load average {res['load_start']:.1f} -> "
          f"{res['load_average']:.1f}")
    print(f"same final model: max |diff| = {diff:.2e}")
    if a.profile:
        pr = cProfile.Profile()
        exp = Experiment(cfg, progress=False)
        pr.enable()
        exp.run(overwrite=True)
        pr.disable()
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        st.sort_stats("tottime").print_stats(20)
        st.sort_stats("cumulative").print_stats(r"mmfl/(engine|algorithms|report)", 25)
        print(s.getvalue())
    if not a.no_write:
        key = ratios["cpu_median_of_pairs"]  # CPU time: what other processes cannot inflate
        section = f"overhead_threads{torch.get_num_threads()}"
        med = record_run("overhead_ratio", key, section, res)
        print(f"overhead_ratio (median over {len(json_runs(section))} recorded runs): {med:.3f}")
    return res


if __name__ == "__main__":
    main()
