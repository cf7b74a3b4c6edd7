"""Peak memory of the personalized evaluation's message route (issue 28, item 7): MOON on
Fashion-MNIST (a stateful algorithm: each client keeps its previous model), 10,000 clients, an
MLP (784-16-10 with MOON's projection head), one round trained, then the personalized evaluation
through the clients, as on Flower (each client is sent its personalized model, the global model
by default, and scores it on its own test rows).

"before" = every client's message built and sent at once (``PERSONAL_CHUNK`` set above the
client count, what mmfl did); "after" = the default, ``PERSONAL_CHUNK`` clients a send. Each in a
fresh process: the peak resident memory during the evaluation (``VmHWM`` of /proc/self/status,
reset through /proc/self/clear_refs just before it) minus the resident memory before it. The two
results must be equal (asserted).

    nice -n 10 .venv/bin/python benchmarks/perf/personal_eval_memory.py [--clients 10000] [--write]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "personal_eval_memory.md"
COMMAND = "nice -n 10 .venv/bin/python benchmarks/perf/personal_eval_memory.py --write"


def _kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} in /proc/self/status")


def child(clients: int, chunk: int, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    from mmfl.config import load_config
    from mmfl.core import evaluation
    from mmfl.engine.runner import Experiment

    if chunk:
        evaluation.PERSONAL_CHUNK = chunk
    cfg = load_config(None, [
        f"output_dir={out}", "name=m", "rounds=1", "data.name=fashion_mnist", "data.test_limit=10000",
        "partition.name=iid", f"partition.num_clients={clients}", "clients_per_round=10",
        "model.name=mlp", "model.hidden=[16]", "algorithm.name=moon", 'state_store="memory"',
        "train.local_epochs=1", "train.batch_size=64", 'train.optimizer="sgd"', "train.lr=0.01", "threads=1"])
    exp = Experiment(cfg, progress=False)
    exp.run()
    ctx = dataclasses.replace(exp.eval_context(0), personal_rows=None)  # through the clients, as on Flower
    exp.transport.begin_round(1)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak
    rss = _kb("VmRSS")
    row = exp.server.evaluate_personalized(ctx)
    print(json.dumps({"extra_kb": _kb("VmHWM") - rss, "rss_kb": rss, "chunk": evaluation.PERSONAL_CHUNK,
                      "metrics": {k: row[k] for k in ("accuracy", "uar", "test_loss", "client_accuracy")}}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--child", nargs=3)
    args = ap.parse_args()
    if args.child:
        return child(int(args.child[0]), int(args.child[1]), args.child[2])
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, chunk in (("before", 10 ** 9), ("after", 0)):
            out = subprocess.run([sys.executable, __file__, "--child", str(args.clients), str(chunk), f"{tmp}/{name}"],
                                 capture_output=True, text=True, cwd=ROOT)
            if out.returncode:
                raise SystemExit(out.stderr)
            res[name] = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["before"]["metrics"] == res["after"]["metrics"], "chunked results differ"
    b, a = res["before"], res["after"]
    text = "\n".join([
        "# Personalized evaluation memory (issue 28, item 7)", "",
        f"Regenerate: `{COMMAND}` (load average at the time: {os.getloadavg()[0]:.1f}).", "",
        f"MOON on Fashion-MNIST, {args.clients} IID clients, MLP 784-16-10, one round trained; the personalized "
        "evaluation through the clients (the message route, as on Flower: each client is sent the global model "
        "and scores it on its own test rows). Extra = peak resident memory during the evaluation (VmHWM, reset "
        "just before) minus the resident memory before it; each variant in a fresh process.", "",
        "| variant | clients per send | resident before (MB) | extra during evaluation (MB) |",
        "|---|---:|---:|---:|",
        f"| before: every client's message at once | {args.clients} | {b['rss_kb'] / 1024:.0f} | {b['extra_kb'] / 1024:.1f} |",
        f"| after: `PERSONAL_CHUNK` clients a send | {a['chunk']} | {a['rss_kb'] / 1024:.0f} | {a['extra_kb'] / 1024:.1f} |",
        "", f"Results identical (asserted): personalized accuracy {a['metrics']['accuracy']:.6f}, "
        f"UAR {a['metrics']['uar']:.6f}, loss {a['metrics']['test_loss']:.6f}, {len(a['metrics']['client_accuracy'])} "
        "per-client accuracies equal.", ""])
    print(text)
    if args.write:
        RESULT.write_text(text)


if __name__ == "__main__":
    main()
