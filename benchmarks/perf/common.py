"""Shared pieces of the performance benchmarks: the issue's workload, the plain
PyTorch reference loop, interleaved timing and the results file.

The workload (issue 8): 100 clients, 10 per round, MOON's simple CNN on
Fashion-MNIST (all 60,000 training images), 1 local epoch, 5 rounds, batch 64,
SGD lr 0.01 momentum 0.9 (weight decay 1e-5, mmfl's default).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from timing import Sample, cpu_clock, interleave, spread

HERE = Path(__file__).resolve().parent
OUT = os.environ.get("MMFL_PERF_OUT", "/tmp/mmfl-perf")  # run folders (run.py: a fresh folder)
RESULTS = Path(os.environ.get("MMFL_PERF_RESULTS") or HERE.parent / "results")  # perf.json's folder (run.py --out)


def workload(name: str, *extra: str, rounds: int = 5, clients: int = 100, per_round: int = 10,
             partition: str = "iid", algorithm: str = "fedavg", out: str | None = None) -> list[str]:
    """``--set`` overrides of the issue's workload (runs under ``out``, default :data:`OUT`)."""
    out = out or OUT
    return ["data.name=fashion_mnist", f"partition.name={partition}", f"partition.num_clients={clients}",
            f"clients_per_round={per_round}", "model.name=simple_cnn", f"algorithm.name={algorithm}",
            "train.optimizer=\"sgd\"", "train.local_epochs=1", "train.batch_size=64", "train.lr=0.01", "train.momentum=0.9",
            f"rounds={rounds}", f"eval_every={rounds}", f"output_dir={out}", f"name={name}", *extra]


def plain_fedavg(X: torch.Tensor, Y: torch.Tensor, parts: list[torch.Tensor], cohorts: list[list[int]],
                 seeds: list[dict[int, int]], make_model: Callable[[], torch.nn.Module], Xt: torch.Tensor,
                 Yt: torch.Tensor, lr: float, momentum: float, weight_decay: float, batch: int, epochs: int):
    """The reference: FedAvg written directly in PyTorch, no framework.

    X, Y: all training images/labels; parts[c]: client c's row indices; cohorts[r]:
    round r's clients; seeds[r][c]: the shuffling seed of client c in round r (the
    same seeds mmfl derives, so both do exactly the same arithmetic). Returns the
    final global model and its test accuracy.
    """
    glob, local = make_model(), make_model()
    for rnd, cohort in enumerate(cohorts):
        g_state = {k: v.clone() for k, v in glob.state_dict().items()}
        total = sum(len(parts[c]) for c in cohort)
        avg = {k: torch.zeros_like(v) for k, v in g_state.items()}
        for cid in cohort:
            local.load_state_dict(g_state)
            local.train()
            opt = torch.optim.SGD(local.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
            idx = parts[cid]
            gen = torch.Generator().manual_seed(seeds[rnd][cid])
            for _ in range(epochs):
                perm = torch.randperm(len(idx), generator=gen)
                for s in range(0, len(idx), batch):
                    rows = idx[perm[s:s + batch]]
                    if len(rows) < 2:
                        continue
                    opt.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(local({"image": X[rows]})["logits"], Y[rows])
                    loss.backward()
                    opt.step()
            w = len(idx) / total
            for k, v in local.state_dict().items():
                avg[k] += w * v
        glob.load_state_dict(avg)
    glob.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(Yt), 1000):
            correct += int((glob({"image": Xt[s:s + 1000]})["logits"].argmax(1) == Yt[s:s + 1000]).sum())
    return glob, correct / len(Yt)


def plain_inputs(exp) -> dict:
    """What :func:`plain_fedavg` needs, taken from an mmfl Experiment (outside any timing)."""
    from mmfl.engine.runner import sample_cohort
    from mmfl.seeds import derive_seed

    cfg, fed = exp.cfg, exp.federation
    base = fed.clients[0]
    parts = [c.indices for c in fed.clients]
    cohorts = [sample_cohort(cfg, r, fed.num_clients) for r in range(cfg.run.rounds)]
    seeds = [{c: derive_seed(cfg.run.seed, r, c, "train", 0) for c in cohorts[r]} for r in range(cfg.run.rounds)]
    tr = cfg.train
    return dict(X=base.features["image"], Y=base.labels, parts=parts, cohorts=cohorts, seeds=seeds,
                make_model=exp.make_model, Xt=fed.test.features["image"], Yt=fed.test.labels, lr=tr.lr,
                momentum=tr.momentum, weight_decay=tr.weight_decay, batch=tr.batch_size, epochs=tr.local_epochs)


class Timer:
    """Wall and CPU seconds of a block (CPU time: every thread of this process plus waited-for
    children, timing.cpu_clock; robust to other processes on a shared machine)."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), cpu_clock()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, cpu_clock() - self.c


def interleaved(variants: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """:func:`timing.interleave` (no warm-up: the callers warm up themselves) of ``variants``;
    (wall, cpu) per run. A variant returning a :class:`Timer` timed its own core."""
    def cell(f):
        def run():
            out = f()
            return Sample(out.cpu, out.wall) if isinstance(out, Timer) else out
        return run
    res = interleave({n: cell(f) for n, f in variants.items()}, repeats, warmup=0,
                     log=lambda m: print(m, flush=True))
    return {n: [(s.wall, s.cpu) for s in ss] for n, ss in res.samples.items()}


def summary(times: list[tuple[float, float]]) -> dict:
    walls, cpus = [w for w, _ in times], [c for _, c in times]
    sc, sw = spread(cpus), spread(walls)
    return {"wall_min": min(walls), "wall_median": statistics.median(walls),
            "cpu_min": min(cpus), "cpu_median": statistics.median(cpus), "cpu_q1": sc["q1"], "cpu_q3": sc["q3"],
            "cpu_max": sc["max"], "wall_q1": sw["q1"], "wall_q3": sw["q3"], "load_average": load_average()}


def paired_ratios(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> dict:
    """a/b per repeat (adjacent runs share the machine's load), then the median; and min(a)/min(b)."""
    wall = [x[0] / y[0] for x, y in zip(a, b)]
    cpu = [x[1] / y[1] for x, y in zip(a, b)]
    return {"wall_median_of_pairs": statistics.median(wall), "cpu_median_of_pairs": statistics.median(cpu),
            "wall_min_over_min": min(x[0] for x in a) / min(y[0] for y in b),
            "cpu_min_over_min": min(x[1] for x in a) / min(y[1] for y in b)}


def load_average() -> float:
    return os.getloadavg()[0]


def update_results(key_values: dict, section: str, details: dict) -> Path:
    """Merge figures into benchmarks/results/perf.json (keys of the issue + a details section)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "perf.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    for k in ("overhead_ratio", "batched_speedup", "peak_rss_gb_10k_clients", "public_agg_peak_extra_gb",
              "flower_sim_ratio"):
        data.setdefault(k, None)
    data.update(key_values)
    data.setdefault("details", {})[section] = details
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def record_run(key: str, value: float, section: str, details: dict) -> float:
    """Append one run's figure to ``details[section]["runs"]`` of perf.json and set ``key`` to the
    median over all recorded runs (every run counts, none is picked); returns that median."""
    path = RESULTS / "perf.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    prev = data.get("details", {}).get(section, {})
    runs = prev.get("runs", []) if isinstance(prev, dict) else []
    runs.append({"value": value, **details})
    med = statistics.median(r["value"] for r in runs)
    update_results({key: round(med, 3)}, section, {"runs": runs, "median": med})
    return med


RUN_ONLY = {"name", "output_dir", "rounds", "eval_every", "threads", "device", "precision", "checkpoint_every",
            "keep_checkpoints", "batch_clients", "state_store", "stream_aggregation", "train", "algorithm"}


def memo_federation():
    """Make Experiment reuse one loaded federation (read-only tensors), so a benchmark can
    build a fresh Experiment per repeat without timing the data set's decoding."""
    import mmfl.engine.runner as runner

    if getattr(runner.build_federation, "_memo", False):
        return
    orig, cache = runner.build_federation, {}

    def build(cfg, pooled=False):
        # every config value except those that cannot change the federation (a key too wide only
        # misses the memo; one too narrow would hand a run another config's clients)
        d = {k: v for k, v in cfg.to_dict().items() if k not in RUN_ONLY}
        key = (json.dumps(d, sort_keys=True, default=str), pooled)
        if key not in cache:
            cache[key] = orig(cfg, pooled)
        return cache[key]

    build._memo = True
    runner.build_federation = build


def json_runs(section: str) -> list[dict]:
    path = RESULTS / "perf.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    return data.get("details", {}).get(section, {}).get("runs", [])
