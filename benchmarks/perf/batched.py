"""Target 2: batched clients (``batch_clients = true``) vs the plain PyTorch loop.

    .venv/bin/python benchmarks/perf/batched.py                          # FedAvg, iid, 3 repeats
    .venv/bin/python benchmarks/perf/batched.py --algorithm moon --partition dirichlet
    .venv/bin/python benchmarks/perf/batched.py --optimizer adam --threads 1 --repeats 5 --no-plain
    .venv/bin/python benchmarks/perf/batched.py --workload multimodal --optimizer adam --threads 1

Times, interleaved: mmfl with batched clients, mmfl sequential and the plain loop
(:func:`common.plain_fedavg`, FedAvg with SGD only) on the issue's workload (``cnn``) or
on the multimodal model over mfeat's six views (``multimodal``: every client every round,
batch 32), with SGD (lr 0.01, momentum 0.9) or Adam (lr 1e-3, mmfl's default), and
checks that the batched run ends within float tolerance of the sequential one. Prints
each mode's CPU and wall time (median, min-max over the repeats) and the per-repeat
ratios sequential / batched (median, min-max).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Timer, interleaved, json_runs, load_average, memo_federation, paired_ratios,  # noqa: E402
                    plain_fedavg, plain_inputs, record_run, summary, update_results, workload)

from mmfl.config import load_config  # noqa: E402
from mmfl.engine.runner import Experiment  # noqa: E402


def spread(times: list[tuple[float, float]]) -> dict:
    return {"wall_min": min(w for w, _ in times), "wall_max": max(w for w, _ in times),
            "cpu_min": min(c for _, c in times), "cpu_max": max(c for _, c in times)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--algorithm", default="fedavg")
    ap.add_argument("--partition", default="iid")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                    help="the clients' optimizer: sgd (lr 0.01, momentum 0.9) or adam (lr 1e-3)")
    ap.add_argument("--workload", choices=["cnn", "multimodal"], default="cnn",
                    help="cnn: the issue's (simple CNN, Fashion-MNIST); multimodal: MLP encoders over mfeat's views")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain loop (it is FedAvg only)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler: the top operators of one round, batched and sequential")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    memo_federation()
    extra = ["algorithm.mu=1.0"] if a.algorithm in ("moon",) else []
    extra += ["train.optimizer=\"adam\"", "train.lr=0.001"] if a.optimizer == "adam" else []
    if a.workload == "multimodal":  # accelerator.py's multimodal workload
        extra += ["data.name=mfeat", "model.name=multimodal", "model.feat_dim=64", "model.mlp_hidden=[128]",
                  "train.batch_size=32"]
    cfgs = {mode: load_config(None, workload(f"batched-{mode}", f"batch_clients={'true' if mode == 'batched' else 'false'}",
                                             *extra, rounds=a.rounds, per_round=a.per_round, clients=a.clients,
                                             partition=a.partition, algorithm=a.algorithm))
            for mode in ("batched", "sequential")}
    probe = Experiment(cfgs["sequential"], progress=False)
    print(f"workload: {a.workload}, {a.algorithm}, {a.optimizer}, {a.partition}, {a.clients} clients, "
          f"{a.per_round} per round, {a.rounds} rounds; "
          f"threads {torch.get_num_threads()}, load average {load_average():.1f}")
    last = {}

    def run(mode):
        def f():
            exp = Experiment(cfgs[mode], progress=False)
            with Timer() as t:
                exp.run(overwrite=True)
            last[mode] = exp
            return t
        return f

    variants = {"batched": run("batched"), "sequential": run("sequential")}
    if a.algorithm == "fedavg" and a.optimizer == "sgd" and a.workload == "cnn" and not a.no_plain:
        inputs = plain_inputs(probe)
        variants["plain"] = lambda: plain_fedavg(**inputs)
    print("warm-up ...", flush=True)
    for f in variants.values():
        f()
    times = interleaved(variants, a.repeats)
    b, s = last["batched"].server.state_dict(), last["sequential"].server.state_dict()
    diff = max(float((b[k] - s[k]).abs().max()) for k in b)
    res = {m: summary(t) for m, t in times.items()}
    res["batched_vs_sequential"] = paired_ratios(times["sequential"], times["batched"])
    if "plain" in times:
        res["batched_vs_plain"] = paired_ratios(times["plain"], times["batched"])
    res.update(final_model_max_abs_diff_vs_sequential=diff, threads=torch.get_num_threads(), repeats=a.repeats,
               algorithm=a.algorithm, partition=a.partition, optimizer=a.optimizer, workload=a.workload,
               spread={m: spread(t) for m, t in times.items()},
               cpu_ratio_pairs=[s_[1] / b_[1] for s_, b_ in zip(times["sequential"], times["batched"])],
               load_average=load_average(),
               command="python benchmarks/perf/batched.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    for m in times:
        sp = res["spread"][m]
        print(f"{m:>10s}: wall median {res[m]['wall_median']:.2f} s ({sp['wall_min']:.2f}-{sp['wall_max']:.2f}); "
              f"cpu median {res[m]['cpu_median']:.2f} s ({sp['cpu_min']:.2f}-{sp['cpu_max']:.2f})")
    pairs = res["cpu_ratio_pairs"]
    print(f"sequential / batched CPU time per repeat: median {statistics.median(pairs):.2f}x "
          f"(min {min(pairs):.2f}x, max {max(pairs):.2f}x; {len(pairs)} interleaved pairs)")
    for key in ("batched_vs_sequential", "batched_vs_plain"):
        if key in res:
            r = res[key]
            print(f"speed-up {key}: wall {r['wall_median_of_pairs']:.2f}x (median of pairs), "
                  f"{r['wall_min_over_min']:.2f}x (min/min); cpu {r['cpu_median_of_pairs']:.2f}x, "
                  f"{r['cpu_min_over_min']:.2f}x")
    print(f"batched vs sequential final model: max |diff| = {diff:.2e}")
    if a.profile:
        from torch.profiler import profile

        for mode in ("sequential", "batched"):
            one = load_config(None, workload(f"profile-{mode}", f"batch_clients={'true' if mode == 'batched' else 'false'}",
                                             *extra, rounds=1, per_round=a.per_round, partition=a.partition,
                                             algorithm=a.algorithm))
            exp = Experiment(one, progress=False)
            with profile() as prof:
                exp.run(overwrite=True)
            print(f"\n--- {mode}: top operators by self CPU time (one round) ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=45))
    if not a.no_write:
        issue = a.clients == 100 and a.per_round == 10  # the issue's workload: the headline figure
        section = f"batched_{a.algorithm}_{a.partition}_threads{torch.get_num_threads()}" + \
            ("" if issue else f"_{a.clients}x{a.per_round}")
        if issue and "batched_vs_plain" in res and a.algorithm == "fedavg" and a.partition == "iid":
            key = res["batched_vs_plain"]["cpu_median_of_pairs"]  # CPU time: other processes cannot inflate it
            med = record_run("batched_speedup", key, section, res)
            print(f"batched_speedup (median over {len(json_runs(section))} recorded runs): {med:.3f}")
        else:
            update_results({}, section, res)
    return res


if __name__ == "__main__":
    main()
