"""mmfl on Flower vs mmfl's simulator: one FedAvg workload, three transports, one run.

Workload (issue 7): FedAvg, 100 clients (Dirichlet beta 0.5), 10 per round,
MOON's simple CNN on the full Fashion-MNIST training set (60,000 images),
1 local epoch, 5 rounds, evaluation every round; one torch thread per process.

1. ``simulator``: ``mmfl run`` (in-process simulation transport);
2. ``flower-simulation``: ``mmfl flower simulate`` (Flower's simulation engine,
   Ray, one virtual SuperNode per client, ``--ray-cpus`` actors of 1 CPU);
3. ``flower-loopback``: a SuperLink and ``--supernodes`` SuperNodes on
   127.0.0.1 (each hosts the clients ``c % supernodes == k``), submitted with
   ``flwr run`` of mmfl's Flower app.

    .venv/bin/python benchmarks/flower/run.py            # full -> benchmarks/results/flower.md
    .venv/bin/python benchmarks/flower/run.py --quick    # a few-minute smoke version -> flower-quick.md

Wall times are measured in the same invocation; "total" includes start-up
(Ray, the Flower processes, the ServerApp) and "rounds" is the sum of the
rounds' wall times from metrics.jsonl. The three final models are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from mmfl.config import resolve
from mmfl.engine.runner import Experiment

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FULL = dict(clients=100, per_round=10, rounds=5, train_limit=0, supernodes=10)
QUICK = dict(clients=20, per_round=4, rounds=2, train_limit=6000, supernodes=4)
MODES = ["simulator", "flower-simulation", "flower-loopback"]


def config(s: dict, name: str, out: Path, threads: int):
    data = {"name": "fashion_mnist"}
    if s["train_limit"]:
        data["train_limit"] = s["train_limit"]
    return resolve({
        "name": name, "output_dir": str(out), "seed": 0, "rounds": s["rounds"],
        "clients_per_round": s["per_round"], "eval_every": 1, "threads": threads,
        "data": data,
        "partition": {"name": "dirichlet", "num_clients": s["clients"], "beta": 0.5},
        "model": {"name": "simple_cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"optimizer": "sgd", "local_epochs": 1, "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5},
    })


def run_mode(mode: str, cfg, s: dict, ray_cpus: int, workdir: Path) -> float:
    t0 = time.perf_counter()
    if mode == "simulator":
        Experiment(cfg, progress=False).run(overwrite=True)
    elif mode == "flower-simulation":
        from mmfl.flower.simulation import simulate

        simulate(cfg, overwrite=True, ray_cpus=ray_cpus)
    else:
        from mmfl.flower.deploy import LocalDeployment

        with LocalDeployment(s["supernodes"], workdir / "loopback") as dep:
            run_id = dep.submit(cfg, overwrite=True)
            status = dep.wait(run_id, done_file=cfg.run_dir / "summary.json")
            if status != "finished:completed":
                raise SystemExit(f"loopback run {status}:\n{dep.run_log(run_id)[-3000:]}")
    return time.perf_counter() - t0


def final_state(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "LATEST").read_text().strip()
    return load_file(str(ckpt / "server.safetensors"))


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def report(s, results: dict, raw: Path, out: Path, cmd: str, load: str) -> str:
    import flwr

    rows = {m: [json.loads(x) for x in (raw / m / "metrics.jsonl").read_text().splitlines()] for m in results}
    base_total = results["simulator"]
    base_rounds = sum(r["wall_time_s"] for r in rows["simulator"])
    ref = final_state(raw / "simulator")
    lines = [
        "# mmfl on Flower vs the in-process simulator", "",
        f"FedAvg, {s['clients']} clients (Dirichlet β=0.5), {s['per_round']} per round, MOON's simple CNN on "
        f"Fashion-MNIST ({s['train_limit'] or 60000} training images), 1 local epoch, {s['rounds']} rounds, "
        "evaluation every round, one torch thread per process. "
        f"Loopback deployment: 1 SuperLink + {s['supernodes']} SuperNodes on 127.0.0.1 "
        f"(SuperNode k hosts clients c ≡ k mod {s['supernodes']}).", "",
        f"Command: `{cmd}` — all three measured in that one invocation.", "",
        f"Machine: {os.cpu_count()} CPUs, {platform.python_version()}, flwr {flwr.__version__}; "
        f"load average at start {load} (shared machine).", "",
        "| transport | total wall (s) | rounds wall (s) | total / simulator | rounds / simulator | final accuracy "
        "| bytes up + down | max abs diff of the final model vs simulator |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, total in results.items():
        rs = rows[m]
        rounds = sum(r["wall_time_s"] for r in rs)
        nbytes = sum(r["bytes_up"] + r["bytes_down"] for r in rs)
        diff = max_diff(final_state(raw / m), ref)
        lines.append(f"| {m} | {total:.1f} | {rounds:.1f} | {total / base_total:.2f}× | {rounds / base_rounds:.2f}× "
                     f"| {rs[-1].get('accuracy', float('nan')):.4f} | {nbytes:,} | {diff:.3g} |")
    lines += ["", "\"total\" includes start-up: Ray and its actors (each loads the data set once), or the SuperLink, "
              "SuperNodes and ServerApp processes and the nodes' hello. \"rounds\" sums the rounds' wall times as "
              "the ServerApp measured them. On the deployment runtime Flower starts one `flwr-clientapp` process per "
              "message (per SuperNode and send), which imports torch and rebuilds the node's data slice, and "
              "SuperNodes poll the SuperLink every 3 s: that, not the training, is most of its time per round. "
              "Bytes are mmfl's message payloads, identical on every transport.", ""]
    out.write_text("\n".join(lines))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller, faster version (20 clients, 2 rounds)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    ap.add_argument("--ray-cpus", type=int, default=2, help="Ray CPUs (= parallel ClientApp actors)")
    ap.add_argument("--supernodes", type=int, help="SuperNodes of the loopback deployment")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--raw", type=Path, help="run folders (default benchmarks/results/raw/flower[-quick])")
    ap.add_argument("--out", type=Path, help="report (default benchmarks/results/flower[-quick].md)")
    args = ap.parse_args(argv)
    s = dict(QUICK if args.quick else FULL)
    if args.supernodes:
        s["supernodes"] = args.supernodes
    suffix = "-quick" if args.quick else ""
    raw = (args.raw or ROOT / "benchmarks" / "results" / "raw" / f"flower{suffix}").resolve()
    out = args.out or ROOT / "benchmarks" / "results" / f"flower{suffix}.md"
    if "simulator" not in args.modes:
        args.modes.insert(0, "simulator")  # the reference of every ratio
    raw.mkdir(parents=True, exist_ok=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    results = {}
    for mode in args.modes:
        cfg = config(s, mode, raw, args.threads)
        results[mode] = run_mode(mode, cfg, s, args.ray_cpus, raw)
        print(f"{mode}: {results[mode]:.1f}s", flush=True)
    shutil.rmtree(raw / "loopback", ignore_errors=True)
    cmd = "python benchmarks/flower/run.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    print(report(s, results, raw, out, cmd, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
