"""The Flower benchmark's spec: ``run`` times each transport (wall.json: total wall seconds, and the
machine it ran on), ``report`` compares them with the simulator (grid.toml says what each is)."""

import json
import os
import platform
import time
from pathlib import Path

FILE = "wall.json"


def run(raw, cfg, run_dir: Path, plan: dict) -> None:
    """Run ``cfg`` on the transport the run's method names; write its wall time and machine."""
    import flwr

    mode, params = plan["method"], plan["params"]
    record = {"load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "cpus": os.cpu_count(),
              "python": platform.python_version(), "flwr": flwr.__version__}
    t0 = time.perf_counter()
    if mode == "simulator":
        from mmfl.engine.runner import Experiment

        Experiment(cfg, progress=False).run(overwrite=True)
    elif mode == "flower-simulation":
        from mmfl.flower.simulation import simulate

        simulate(cfg, overwrite=True, ray_cpus=params["ray_cpus"])
    else:
        import shutil

        from mmfl.flower.deploy import LocalDeployment

        work = run_dir.parent / "loopback"
        with LocalDeployment(params["supernodes"], work) as dep:
            run_id = dep.submit(cfg, overwrite=True)
            status = dep.wait(run_id, done_file=cfg.run_dir / "summary.json")
            if status != "finished:completed":
                raise RuntimeError(f"loopback run {status}:\n{dep.run_log(run_id)[-3000:]}")
        shutil.rmtree(work, ignore_errors=True)
    (run_dir / FILE).write_text(json.dumps({**record, "total_s": time.perf_counter() - t0}))


def final_state(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "LATEST").read_text().strip()
    return load_file(str(ckpt / "server.safetensors"))


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def report(b) -> list[str]:
    names = {m: b.names("transports", m)[0] for m in b.methods("transports")}
    names = {m: n for m, n in names.items() if (b.raw / n / FILE).is_file()}  # the finished ones
    walls = {m: json.loads((b.raw / n / FILE).read_text()) for m, n in names.items()}
    rows = {m: b.results.rows(n) for m, n in names.items()}
    cfg, p, ref_wall = b.config("transports"), b.params, walls["simulator"]
    base_total, base_rounds = ref_wall["total_s"], sum(r["wall_time_s"] for r in rows["simulator"])
    ref = final_state(b.raw / names["simulator"])
    lines = [
        "# mmfl on Flower vs the in-process simulator", "",
        f"FedAvg, {cfg['partition']['num_clients']} clients (Dirichlet β={cfg['partition']['beta']}), "
        f"{cfg['clients_per_round']} per round, MOON's simple CNN on Fashion-MNIST "
        f"({cfg['data'].get('train_limit') or 60000} training images), 1 local epoch, {cfg['rounds']} rounds, "
        "evaluation every round, one torch thread per process. "
        f"Loopback deployment: 1 SuperLink + {p['supernodes']} SuperNodes on 127.0.0.1 "
        f"(SuperNode k hosts clients c ≡ k mod {p['supernodes']}).", "",
        f"Command: `{p['command']}` — all three measured in that one invocation.", "",
        f"Machine: {ref_wall['cpus']} CPUs, {ref_wall['python']}, flwr {ref_wall['flwr']}; "
        f"load average at start {ref_wall['load']} (shared machine).", "",
        "| transport | total wall (s) | rounds wall (s) | total / simulator | rounds / simulator | final accuracy "
        "| bytes up + down | max abs diff of the final model vs simulator |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, w in walls.items():
        rs, total = rows[m], w["total_s"]
        rounds = sum(r["wall_time_s"] for r in rs)
        nbytes = sum(r["bytes_up"] + r["bytes_down"] for r in rs)
        diff = max_diff(final_state(b.raw / names[m]), ref)
        lines.append(f"| {m} | {total:.1f} | {rounds:.1f} | {total / base_total:.2f}× | {rounds / base_rounds:.2f}× "
                     f"| {rs[-1].get('accuracy', float('nan')):.4f} | {nbytes:,} | {diff:.3g} |")
    lines += ["", "\"total\" includes start-up: Ray and its actors (each loads the data set once), or the SuperLink, "
              "SuperNodes and ServerApp processes and the nodes' hello. \"rounds\" sums the rounds' wall times as "
              "the ServerApp measured them. On the deployment runtime Flower starts one `flwr-clientapp` process per "
              "message (per SuperNode and send), which imports torch and rebuilds the node's data slice, and "
              "SuperNodes poll the SuperLink every 3 s: that, not the training, is most of its time per round. "
              "Bytes are mmfl's message payloads, identical on every transport.", ""]
    return lines
