"""Fixed costs of short runs, sweeps and Flower client processes (issue 17, item 6), before and
after, measured in one run of this script, each timing in a fresh subprocess (warm file caches:
every variant runs once untimed first). Every figure is CPU time (the child process's user +
system time, ``benchmarks/perf/timing.py``), the variants interleaved over ``--repeats``; cells
show the median (q1–q3), ratios are before / after of the medians, and the load average is
recorded at start and end.

1. the first optimizer of a process: ``torch.optim.SGD`` (imports ``torch._dynamo``) vs
   ``mmfl.core.optim.SGD`` (the same class without the import);
2. packaged configs, a short run end to end (``python -c`` = one sweep job / Flower client process
   in cost): "before" = torch.optim's classes patched in and ``accuracy.png`` drawn at the end
   (what a run did); "after" = the defaults;
3. FedCMI's packaged config: ``eval_every = 1`` (before) vs its ``eval_every = 5``;
4. the disk client-state store: write_checkpoint + commit of every round (``checkpoint_every = 1``)
   vs every 5th round, clients holding MOON's CNN (its initial weights) as state.

    nice -n 10 .venv/bin/python benchmarks/perf/fixed_costs.py [--repeats 3] [--write]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Sample, cpu_clock, fmt_spread, interleave, spread  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "fixed_costs.md"
PY = sys.executable

FIRST_OPT = """
import time, torch
torch.set_num_threads(1)
p = torch.nn.Parameter(torch.zeros(3))
t = time.process_time()
{ctor}
print(time.process_time() - t)
"""

RUN = """
import sys, torch
import mmfl.api as api
if {before}:
    import mmfl.core.optim as o  # the classes before: torch.optim's own
    o.SGD, o.Adam = torch.optim.SGD, torch.optim.Adam
res = api.run("{config}", set={sets!r}, overwrite=True, progress=False)
if {before}:
    res.plot()  # what the runner's _finish did
"""

CONFIGS = [("demo.toml", 1), ("fedcmi.toml", 1), ("partialfl_digits.toml", 1), ("wireless_digits.toml", 1)]


def timed(code: str) -> None:
    """Run ``python -c code`` (interpreter start to exit); :func:`timing.measure` reads its CPU
    time from the waited-for child's rusage."""
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)


def printed(code: str) -> Sample:
    """The CPU seconds the child printed (its own timing of one statement)."""
    t = time.perf_counter()
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return Sample(float(out.stdout.strip().splitlines()[-1]), time.perf_counter() - t)


def spreads(variants: dict, repeats: int, fn, log: list) -> dict[str, dict]:
    """CPU-time :func:`timing.spread` per variant: one untimed warm-up each (file caches), then
    ``repeats`` interleaved rounds; the load average around them goes to ``log``."""
    res = interleave({k: (lambda c=code: fn(c)) for k, code in variants.items()}, repeats, warmup=1, log=None)
    log.append((res.load_start, res.load_end))
    return {k: res.cpu(k) for k in variants}


def run_code(config: str, rounds: int, out: str, before: bool, *extra: str) -> str:
    sets = ["threads=1", f"rounds={rounds}", f"output_dir={out}", *extra]
    return RUN.format(before=before, config=f"mmfl/configs/{config}", sets=sets)


def moon_state() -> dict:
    """MOON's CNN on Fashion-MNIST (the issue's workload), its seeded initial weights as a client's
    ``prev/`` state."""
    from mmfl.config import load_config
    from mmfl.data.federation import build_federation
    from mmfl.models.factory import model_factory

    cfg = load_config(None, ["data.name=fashion_mnist", "model.name=simple_cnn", "partition.num_clients=2"])
    sd = model_factory(cfg, build_federation(cfg).meta)().state_dict()
    return {f"prev/{k}": v.detach().clone() for k, v in sd.items()}


def store_costs(kind: str, state: dict, clients: int, per_round: int, rounds: int, every: int, root: Path) -> float:
    """Seconds in checkpoint.save (the store's write_checkpoint) + commit over ``rounds`` rounds,
    checkpointing as the runner does with ``checkpoint_every = every``."""
    import torch

    from mmfl.engine import checkpoint
    from mmfl.engine.state_store import ClientStateStore, DiskClientStateStore

    store = DiskClientStateStore(root / "store") if kind == "disk" else ClientStateStore()
    spent = 0.0
    for rnd in range(rounds):
        for cid in range(rnd * per_round, (rnd + 1) * per_round):
            store.save(cid % clients, state)
        if (rnd + 1) % every == 0 or rnd + 1 == rounds:
            t = cpu_clock()
            checkpoint.save(root / "ckpt", rnd + 1, {"w": torch.zeros(1)}, store.write_checkpoint,
                            {"round": rnd + 1})
            store.commit()
            spent += cpu_clock() - t
    if kind == "disk":
        store.close()
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3, 4], help="which of 1-4 to run")
    ap.add_argument("--write", action="store_true", help=f"also write {RESULT.relative_to(ROOT)}")
    args = ap.parse_args()
    lines = ["# Fixed costs (issue 17, item 6)", "",
             "Command: `nice -n 10 .venv/bin/python benchmarks/perf/fixed_costs.py --repeats "
             f"{args.repeats} --write` (2-core shared CPU, 1 thread). CPU time (user + system of each fresh "
             f"process), median (q1–q3) of {args.repeats} interleaved repeats after one untimed warm-up each; "
             f"load average at the start: {os.getloadavg()[0]:.1f}.", ""]
    loads: list = []

    if 1 in args.sections:
        first = spreads({"torch.optim.SGD": FIRST_OPT.format(ctor="torch.optim.SGD([p], lr=0.1)"),
                         "mmfl.core.optim.SGD": FIRST_OPT.format(
                             ctor="import mmfl.core.optim as o; o.SGD([p], lr=0.1)")}, args.repeats, printed, loads)
        med = {k: v["median"] for k, v in first.items()}
        lines += ["## 1. The first optimizer of a process", "",
                  "| constructor | CPU seconds | ratio |", "|---|---|---|",
                  f"| `torch.optim.SGD` (imports torch._dynamo) | {fmt_spread(first['torch.optim.SGD'], 3)} | "
                  f"{med['torch.optim.SGD'] / med['mmfl.core.optim.SGD']:.0f}x |",
                  f"| `mmfl.core.optim.SGD` | {fmt_spread(first['mmfl.core.optim.SGD'], 3)} | 1 |", ""]
        print("\n".join(lines), flush=True)

    with tempfile.TemporaryDirectory(prefix="mmfl-fixed-") as tmp:
        out = ["## 2. Packaged configs, one short run per process", "",
               "before = torch.optim's classes + accuracy.png drawn at the end; after = defaults.", "",
               "| config | rounds | before (CPU s) | after (CPU s) | saved (s) | before / after |", "|---|---|---|---|---|---|"]
        for config, rounds in CONFIGS if 2 in args.sections else []:
            sp = spreads({b: run_code(config, rounds, tmp, b) for b in (True, False)}, args.repeats, timed, loads)
            m = {k: v["median"] for k, v in sp.items()}
            out.append(f"| {config} | {rounds} | {fmt_spread(sp[True])} | {fmt_spread(sp[False])} | "
                       f"{m[True] - m[False]:.2f} | {m[True] / m[False]:.2f} |")
            print(out[-1], flush=True)
        lines += out + [""] if 2 in args.sections else []

        sp = {} if 3 not in args.sections else spreads(
            {e: run_code("fedcmi.toml", 5, tmp, False, f"eval_every={e}") for e in (1, 5)}, args.repeats, timed, loads)
        m = {k: v["median"] for k, v in sp.items()}
        lines += [] if not m else ["## 3. FedCMI's packaged config, 5 rounds", "",
                  "| eval_every | CPU seconds | ratio |", "|---|---|---|",
                  f"| 1 (before) | {fmt_spread(sp[1])} | {m[1] / m[5]:.2f} |", f"| 5 (now) | {fmt_spread(sp[5])} | 1 |", ""]
        print("\n".join(lines[-6:]) if m else "", flush=True)

    if 4 in args.sections:
        state = moon_state()
        kb = sum(t.numel() * t.element_size() for t in state.values()) / 1024
        lines += ["## 4. Client-state store: checkpoint + commit", "",
                  f"Clients save MOON's CNN as state ({kb:.0f} KB), 10 rounds; seconds in checkpoint.save + "
                  "commit over the run. The memory store writes every client's state into each checkpoint; "
                  "the disk store only the changes since the last one (with 2,000 clients each changes once; with 400, "
                  "each about 5 times).", "",
                  "| store | clients | per round | checkpoint_every = 1 (CPU s) | = 5 (CPU s) | ratio |", "|---|---|---|---|---|---|"]
        for kind, clients, per_round in (("memory", 400, 40), ("disk", 2000, 200), ("disk", 400, 200)):
            costs = {every: [] for every in (1, 5)}
            for r in range(args.repeats):  # interleaved: 1 5, 5 1, ...
                for every in ((1, 5) if r % 2 == 0 else (5, 1)):
                    with tempfile.TemporaryDirectory(prefix="mmfl-fixed-") as tmp:
                        costs[every].append(store_costs(kind, state, clients, per_round, 10, every, Path(tmp)))
            sp = {e: spread(v) for e, v in costs.items()}
            lines.append(f"| {kind} | {clients} | {per_round} | {fmt_spread(sp[1])} | {fmt_spread(sp[5])} | "
                         f"{sp[1]['median'] / sp[5]['median']:.2f} |")
            print(lines[-1], flush=True)
        lines.append("")
    lines.append(f"Load average at the end: {os.getloadavg()[0]:.1f}.")
    lines.append("")
    if args.write:
        RESULT.write_text("\n".join(lines))
        print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
