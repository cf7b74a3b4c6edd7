"""Checkpoint bytes written per round over a run (issue 28, item 7): MOON on Fashion-MNIST
(MOON's simple CNN, whose previous model every client keeps as state), 500 clients, 10 a round,
20 rounds, the memory client-state store, a checkpoint every round.

"before" = the whole store rewritten into ``clients.safetensors`` by every checkpoint (the
format before pieces, still selectable: ``ClientStateStore.incremental = False``); "after" = the
default: only the clients saved since the last checkpoint, as content-addressed pieces
(mmfl.engine.pieces). Bytes written = the process's ``wchar`` (/proc/self/io) across each
``checkpoint.save`` call: every byte the checkpoint wrote (tensor files, pieces, meta.json,
LATEST); kept on disk = the size of ``checkpoints/`` after it.

    nice -n 10 .venv/bin/python benchmarks/perf/checkpoint_growth.py [--write]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "checkpoint_growth.md"
COMMAND = "nice -n 10 .venv/bin/python benchmarks/perf/checkpoint_growth.py --write"


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise SystemExit("no wchar in /proc/self/io")


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(incremental: bool, args, out: Path) -> list[dict]:
    from mmfl.config import load_config
    from mmfl.engine import checkpoint
    from mmfl.engine.runner import Experiment
    from mmfl.engine.state_store import ClientStateStore

    rows: list[dict] = []
    save = checkpoint.save
    exp = None

    def counting(root, rnd, *a, **k):
        before = wchar()
        final = save(root, rnd, *a, **k)
        rows.append({"round": rnd, "written": wchar() - before, "kept": du(Path(root)),
                     "clients_seen": len(exp.store)})
        return final

    ClientStateStore.incremental = incremental
    checkpoint.save = counting
    try:
        cfg = load_config(None, [
            f"output_dir={out}", f"name={'after' if incremental else 'before'}", f"rounds={args.rounds}",
            "data.name=fashion_mnist", f"data.train_limit={args.train_limit}", "data.test_limit=1000",
            "partition.name=iid", f"partition.num_clients={args.clients}", f"clients_per_round={args.per_round}",
            "model.name=simple_cnn", "model.out_dim=256", "algorithm.name=moon", 'state_store="memory"',
            "train.local_epochs=1", "train.batch_size=64", 'train.optimizer="sgd"', "train.lr=0.01",
            "threads=1", f"eval_every={args.rounds}", "checkpoint_every=1"])
        exp = Experiment(cfg, progress=False)
        exp.run()
    finally:
        checkpoint.save = save
        ClientStateStore.incremental = True
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--train-limit", type=int, default=10000)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = measure(False, args, Path(tmp))
        after = measure(True, args, Path(tmp))
    mb = 1e6
    lines = [
        "# Checkpoint bytes per round (issue 28, item 7)", "",
        f"Regenerate: `{COMMAND}` (load average at the time: {os.getloadavg()[0]:.1f}; bytes do not depend on it).",
        "",
        f"MOON on Fashion-MNIST ({args.train_limit} training images, IID), MOON's simple CNN (out_dim 256), "
        f"{args.clients} clients, {args.per_round} a round, {args.rounds} rounds, memory client-state store, "
        "a checkpoint every round (keep_checkpoints = 1). *Written*: bytes the process wrote during "
        "`checkpoint.save` (`wchar`, /proc/self/io); *kept*: the size of `checkpoints/` after it. "
        "Before: every checkpoint rewrites every client seen (`clients.safetensors`, still selectable as "
        "`ClientStateStore.incremental = False`); after: only the clients saved since the last checkpoint, "
        "as content-addressed pieces named by `clients.json` (mmfl/engine/pieces.py).", "",
        "| round | clients seen | before: written (MB) | after: written (MB) | before: kept (MB) | after: kept (MB) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for b, a in zip(before, after):
        assert b["clients_seen"] == a["clients_seen"]
        lines.append(f"| {b['round']} | {b['clients_seen']} | {b['written'] / mb:.2f} | {a['written'] / mb:.2f} "
                     f"| {b['kept'] / mb:.2f} | {a['kept'] / mb:.2f} |")
    lines += ["", f"Round {args.rounds} / round 1, bytes written: before {before[-1]['written'] / before[0]['written']:.1f}x, "
              f"after {after[-1]['written'] / after[0]['written']:.2f}x (max over rounds / round 1: "
              f"{max(r['written'] for r in after) / after[0]['written']:.2f}x). The kept checkpoint is the same size "
              "either way (every client's state, once); only what each round rewrites changed.", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        RESULT.write_text(text)


if __name__ == "__main__":
    main()
