"""Run-level workloads of the perf grid (``call = "mmfl.bench.perf_runs:<factory>"``, as in
:mod:`mmfl.bench.perf_targets`): whole mmfl runs, the same FedAvg written directly in PyTorch,
per-round times, the facts a run leaves behind. Setup (config, data set decoded) is outside the
timing; every input is a real data set read through mmfl."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from mmfl.bench.timing import Sample, measure


def _experiment_factory(sets: list[str]):
    """A fresh Experiment per call over one decoded federation (read-only tensors), so repeats time
    the run, not the data set's decoding; and the first Experiment (the probe)."""
    import mmfl.engine.runner as runner
    from mmfl.config import load_config

    cfg = load_config(None, [f"output_dir={tempfile.mkdtemp(prefix='mmfl-perf-')}", "name=perf", *sets])
    probe = runner.Experiment(cfg, progress=False)

    def make():
        orig, runner.build_federation = runner.build_federation, lambda *a, **k: probe.federation
        try:
            return runner.Experiment(cfg, progress=False)
        finally:
            runner.build_federation = orig
    return make, probe


def plain_fedavg(exp) -> torch.nn.Module:
    """FedAvg written directly in PyTorch, no framework, over ``exp``'s partition, cohorts and
    shuffling seeds (the seeds mmfl derives, so both do the same arithmetic); the final model."""
    from mmfl.engine.runner import sample_cohort
    from mmfl.seeds import derive_seed

    cfg, fed, tr = exp.cfg, exp.federation, exp.cfg.train
    X, Y = fed.clients[0].features["image"], fed.clients[0].labels
    glob, local = exp.make_model(), exp.make_model()
    for rnd in range(cfg.run.rounds):
        cohort = sample_cohort(cfg, rnd, fed.num_clients)
        g_state = {k: v.clone() for k, v in glob.state_dict().items()}
        total = sum(len(fed.clients[c].indices) for c in cohort)
        avg = {k: torch.zeros_like(v) for k, v in g_state.items()}
        for cid in cohort:
            local.load_state_dict(g_state)
            local.train()
            opt = torch.optim.SGD(local.parameters(), lr=tr.lr, momentum=tr.momentum, weight_decay=tr.weight_decay)
            idx = fed.clients[cid].indices
            gen = torch.Generator().manual_seed(derive_seed(cfg.run.seed, rnd, cid, "train", 0))
            for _ in range(tr.local_epochs):
                perm = torch.randperm(len(idx), generator=gen)
                for s in range(0, len(idx), tr.batch_size):
                    rows = idx[perm[s:s + tr.batch_size]]
                    if len(rows) < 2:
                        continue
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(local({"image": X[rows]})["logits"], Y[rows]).backward()
                    opt.step()
            for k, v in local.state_dict().items():
                avg[k] += len(idx) / total * v
        glob.load_state_dict(avg)
    glob.eval()
    with torch.no_grad():  # the final evaluation on the test images, as mmfl's run does
        Xt, Yt = fed.test.features["image"], fed.test.labels
        sum(int((glob({"image": Xt[s:s + 1000]})["logits"].argmax(1) == Yt[s:s + 1000]).sum())
            for s in range(0, len(Yt), 1000))
    return glob


def fedavg(side: str, sets: list[str]):
    """One FedAvg run of ``sets``: ``side = "mmfl"`` (``Experiment(cfg).run()``) or ``"plain"``
    (:func:`plain_fedavg`, same clients and batches); returns the final global state (``diff``)."""
    make, probe = _experiment_factory(sets)
    if side == "plain":
        return lambda: plain_fedavg(probe).state_dict()

    def run():
        exp = make()
        exp.run(overwrite=True)
        return exp.server.model.state_dict()
    return run


def round_times(sets: list[str]):
    """One run; the CPU and wall time of each round plus its checkpoint, from round 2 on (round 1
    pays one-off costs), as samples; the run's client-state store as ``store``."""
    make, _ = _experiment_factory(sets)

    def run() -> dict:
        exp = make()
        rounds, ckpts = [], []
        inner, orig = exp.server.round, exp._checkpoint

        def timed_round(rnd, cohort, transport):
            s, row = measure(lambda: inner(rnd, cohort, transport))
            rounds.append(s)
            return row
        exp.server.round = timed_round
        exp._checkpoint = lambda rnd: ckpts.append(measure(lambda: orig(rnd))[0])
        exp.run(overwrite=True)
        return {"samples": [Sample(r.cpu + c.cpu, r.wall + c.wall) for r, c in zip(rounds, ckpts)][1:],
                "store": type(exp.store).__name__}
    return run


def _bytes(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def run_facts(sets: list[str], model: str = ""):
    """An mmfl run (the Experiment built outside the call); returns its final accuracy, clients
    holding state, store, the bytes of its state files and checkpoints; ``model``: a file the final
    global state is saved to (:func:`model_diff` compares two)."""
    make, _ = _experiment_factory(sets)
    exp = make()

    def run() -> dict:
        exp.run(overwrite=True)
        if model:
            torch.save(exp.server.model.state_dict(), model)
        rows = [json.loads(x) for x in (exp.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        final = rows[-1] if rows else {}
        return {"accuracy": final.get("accuracy"), "clients_with_state": len(exp.store),
                "store": type(exp.store).__name__, "state_files": _bytes(exp.run_dir / "client_state"),
                "checkpoints": _bytes(exp.run_dir / "checkpoints")}
    return run


def model_diff(a: str, b: str):
    """Two saved states: elements that differ, elements, the largest absolute difference."""
    def run() -> dict:
        x, y = torch.load(a), torch.load(b)
        return {"max_abs_diff": max(float((x[k].double() - y[k].double()).abs().max()) for k in x),
                "elements_differing": sum(int((x[k] != y[k]).sum()) for k in x),
                "elements": sum(v.numel() for v in x.values())}
    return run


def contrastive_agg(clients: int, public: int, dim: int, chunk: int, threads: int = 0, data: str = "fashion_mnist"):
    """CreamFL's global-local contrastive aggregation (image side) over ``public`` real images as
    representations, ``clients`` local sets; returns the inputs' and the full matrix's size (bytes)."""
    from mmfl.algorithms.public_terms import global_local_contrastive_aggregation
    from mmfl.bench.perf_targets import real_rows

    if threads:
        torch.set_num_threads(threads)
    x = real_rows(data, public, dim)
    local, glob = x.expand(clients, public, dim).contiguous(), x.roll(1, 0).contiguous()

    def run() -> dict:
        global_local_contrastive_aggregation(local, glob, chunk=chunk)
        return {"inputs": (local.numel() + glob.numel()) * 4, "full_matrix_per_client": public * public * 4}
    return run


RUN_ONLY = {"name", "output_dir", "rounds", "eval_every", "threads", "device", "precision", "checkpoint_every",
            "keep_checkpoints", "batch_clients", "state_store", "stream_aggregation", "train", "algorithm"}


def memo_federation() -> None:
    """Make every Experiment of this process reuse one decoded federation per data configuration
    (read-only tensors), so a benchmark building a fresh Experiment per repeat does not time the
    data set's decoding (benchmarks/perf/accelerator.py)."""
    import mmfl.engine.runner as runner

    if getattr(runner.build_federation, "_memo", False):
        return
    orig, cache = runner.build_federation, {}

    def build(cfg, pooled=False):
        # every config value except those that cannot change the federation (a key too wide only
        # misses the memo; one too narrow would hand a run another config's clients)
        key = (json.dumps({k: v for k, v in cfg.to_dict().items() if k not in RUN_ONLY}, sort_keys=True, default=str), pooled)
        if key not in cache:
            cache[key] = orig(cfg, pooled)
        return cache[key]

    build._memo = True
    runner.build_federation = build
