"""Target 3: peak RSS of a run with 10,000 clients that all hold persistent state.

    .venv/bin/python benchmarks/perf/memory.py                       # MOON and SCAFFOLD, disk store
    .venv/bin/python benchmarks/perf/memory.py --stores disk memory  # + the in-memory store

Each run is a child process (its own peak RSS, ``ru_maxrss``): Fashion-MNIST (all
60,000 images) split iid over 10,000 clients, MOON's simple CNN, ``--per-round``
clients per round for ``--rounds`` rounds (default 1,000 x 10: about 6,500 distinct
clients end up holding a MOON previous model or a SCAFFOLD control variate of
75,322 floats, 294 KB each, and every round reads back the state of those sampled
before), a checkpoint after every round. The round's own messages (1,000 replies
carrying a model each, about 300 MB) are live while the server aggregates them;
that is the cohort's share, the same for either store.

Every cell (algorithm x store) runs ``--repeats`` times, the cells interleaved
(``benchmarks/perf/timing.py``): peak RSS and the run's CPU time (the child's user + system
time) are reported as median and spread over the repeats, with the load average around them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, update_results, workload  # noqa: E402
from timing import interleave, spread  # noqa: E402

CHILD = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
from mmfl.config import load_config
from mmfl.engine.runner import Experiment
cfg = load_config(None, json.loads(sys.argv[1]))
t = time.process_time()
exp = Experiment(cfg, progress=False)
exp.run(overwrite=True)
n = len(exp.store)
print(json.dumps({"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "cpu_s": time.process_time() - t, "clients_with_state": n,
                  "store": type(exp.store).__name__}))
"""


def du(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=1000)
    ap.add_argument("--algorithms", nargs="+", default=["moon", "scaffold"])
    ap.add_argument("--stores", nargs="+", default=["disk"])
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of every cell")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {}

    def cell(algo: str, store: str):
        def run() -> None:
            name = f"memory-{algo}-{store}"
            over = workload(name, f"state_store={store}", rounds=a.rounds, clients=a.clients,
                            per_round=a.per_round, algorithm=algo, out=a.out)
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(over)], capture_output=True, text=True)
            if p.returncode != 0:
                print(p.stderr[-3000:])
                raise SystemExit(f"{name}: failed")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            run_dir = Path(a.out) / name
            r["state_files_gb"] = du(run_dir / "client_state") / 2**30
            r["checkpoints_gb"] = du(run_dir / "checkpoints") / 2**30
            runs.setdefault(f"{algo}/{store}", []).append(r)
            print(f"{algo:>9s} {store:>6s}: peak RSS {r['peak_rss_gb']:.2f} GB, {r['clients_with_state']} clients "
                  f"with state, CPU {r['cpu_s']:.0f} s; state files {r['state_files_gb']:.2f} GB, "
                  f"checkpoints {r['checkpoints_gb']:.2f} GB", flush=True)
        return run

    cmp = interleave({f"{algo}/{store}": cell(algo, store) for algo in a.algorithms for store in a.stores},
                     a.repeats, warmup=0, log=None)
    res = {}
    for key, rs in runs.items():
        last = rs[-1]
        res[key] = {"peak_rss_gb": spread(r["peak_rss_gb"] for r in rs)["median"],
                    "peak_rss": spread(r["peak_rss_gb"] for r in rs), "cpu": cmp.cpu(key), "wall": cmp.wall(key),
                    "seconds": cmp.cpu(key)["median"], "clients_with_state": last["clients_with_state"],
                    "store": last["store"], "state_files_gb": last["state_files_gb"],
                    "checkpoints_gb": last["checkpoints_gb"]}
    disk = [r["peak_rss_gb"] for k, r in res.items() if k.endswith("/disk")]
    res.update(clients=a.clients, rounds=a.rounds, per_round=a.per_round, repeats=a.repeats,
               load_start=cmp.load_start, load_average=cmp.load_end,
               command="python benchmarks/perf/memory.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    if disk and not a.no_write:
        update_results({"peak_rss_gb_10k_clients": round(max(disk), 3)} if a.clients == 10_000 else {},
                       "memory" if a.clients == 10_000 else f"memory_{a.clients}", res)
    return res


if __name__ == "__main__":
    main()
