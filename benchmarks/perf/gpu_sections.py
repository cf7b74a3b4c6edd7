"""The sections of the GPU check (benchmarks/perf/gpu_check.py). Each takes the check's context
(a dict: device, smoke, data roots, work folder, deadline) and returns ``{"lines": [...markdown],
"figures": {...}}``; the driver runs each in its own child process under a time limit.

Timing: on CUDA each training round is bracketed by CUDA events (GPU time: the stream's elapsed
time from the round's first to its last queued kernel) and by the host clock after a
``torch.cuda.synchronize`` (wall time); round 1 pays one-off costs (kernel loading, cuDNN's
algorithm search) and is left out of the medians.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

FULL = dict(prec_clients=10, prec_train=10_000, prec_test=2_000, prec_rounds=5, cohorts=[10, 100], per_client=64,
            coh_rounds=3, flower_cohort=10, flower_nodes=2, flower_rounds=3, public=(10, 50_000, 512), public_reps=3,
            moon_rounds=2, moon_setting="0.5")
SMOKE = dict(prec_clients=3, prec_train=240, prec_test=60, prec_rounds=2, cohorts=[3], per_client=16, coh_rounds=2,
             flower_cohort=2, flower_nodes=2, flower_rounds=2, public=(3, 400, 32), public_reps=2, moon_rounds=2,
             moon_setting="0.5", moon_train=240, moon_test=60, moon_methods=["fedavg", "moon"])


def sizes(ctx) -> dict:
    return SMOKE if ctx["smoke"] else FULL


def left(ctx) -> float:
    return ctx["deadline"] - time.time()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


class RoundTimer:
    """Wraps ``exp.server.round``: per round, wall seconds and (CUDA) GPU seconds by events."""

    def __init__(self, exp, dev: torch.device):
        self.dev, self.wall, self.gpu = dev, [], []
        inner, cuda = exp.server.round, dev.type == "cuda"

        def timed(rnd, cohort, transport):
            if cuda:
                torch.cuda.synchronize(dev)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            row = inner(rnd, cohort, transport)
            if cuda:
                end.record()
                torch.cuda.synchronize(dev)
                self.gpu.append(start.elapsed_time(end) / 1e3)
            self.wall.append(time.perf_counter() - t)
            return row

        exp.server.round = timed

    def steady(self) -> tuple[float, float | None]:
        """Median wall and GPU seconds of the rounds after the first."""
        w = self.wall[1:] or self.wall
        g = self.gpu[1:] or self.gpu
        return med(w), (med(g) if g else None)


def train_cfg(ctx, name: str, **over) -> dict:
    cfg = {"name": name, "output_dir": str(Path(ctx["work"]) / "runs"), "seed": 0, "device": ctx["device"]}
    if ctx["device"] == "cpu":
        cfg["threads"] = 1
    return cfg | over


def run_timed(cfg: dict, dev: torch.device) -> tuple[list[dict], RoundTimer]:
    import mmfl
    from mmfl.engine.runner import Experiment
    from mmfl.report import load_metrics

    exp = Experiment(mmfl.configure(cfg), progress=False)
    timer = RoundTimer(exp, dev)
    exp.run(overwrite=True)
    return load_metrics(exp.run_dir), timer


def save_partial(ctx, res: dict) -> None:
    """What a section has measured so far (the driver reports it if the section is stopped)."""
    if ctx.get("section"):
        Path(ctx["work"], f"result-{ctx['section']}.json").write_text(json.dumps(res | {"partial": True}, default=str))


def fmt(v, spec=".3f", none="—"):
    return none if v is None or v != v else format(v, spec)


# ----------------------------------------------------------------------------- bf16 vs fp32

def precision_cfg(ctx, s, prec: str) -> dict:
    n = s["prec_clients"]
    return train_cfg(ctx, f"precision-{prec}", rounds=s["prec_rounds"], eval_every=s["prec_rounds"],
                     clients_per_round=n, batch_clients=True, precision=prec,
                     data={"name": "fashion_mnist", "root": ctx["fashion"], "train_limit": s["prec_train"],
                           "test_limit": s["prec_test"]},
                     partition={"name": "iid", "num_clients": n}, model={"name": "simple_cnn"},
                     algorithm={"name": "fedavg"},
                     train={"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "local_epochs": 1, "batch_size": 64})


def sec_precision(ctx) -> dict:
    s, dev = sizes(ctx), torch.device(ctx["device"])
    n, res = s["prec_clients"], {}
    for prec in ("fp32", "bf16"):
        rows, timer = run_timed(precision_cfg(ctx, s, prec), dev)
        wall, gpu = timer.steady()
        res[prec] = {"train_loss": rows[-1].get("train_loss"), "accuracy": rows[-1].get("accuracy"),
                     "round_wall_s": wall, "round_gpu_s": gpu, "fallback": rows[-1].get("batched_fallback"),
                     "losses": [r.get("train_loss") for r in rows]}
    a, b = res["fp32"], res["bf16"]
    lines = [f"Same run both ways: FedAvg, MOON's simple CNN on Fashion-MNIST ({s['prec_train']:,} training images over "
             f"{n} iid clients, stacked, SGD lr 0.05 momentum 0.9, batch 64, 1 local epoch, {s['prec_rounds']} rounds, "
             f"seed 0; test accuracy on {s['prec_test']:,} test images after the last round).", "",
             "| precision | final train loss | test accuracy | round wall (s) | round GPU (s) |", "|---|---|---|---|---|"]
    for k, r in res.items():
        lines.append(f"| {k} | {fmt(r['train_loss'], '.4f')} | {fmt(r['accuracy'], '.4f')} | {fmt(r['round_wall_s'])} "
                     f"| {fmt(r['round_gpu_s'])} |")
    if a["accuracy"] is not None and b["accuracy"] is not None:
        lines += ["", f"bf16 − fp32: accuracy {b['accuracy'] - a['accuracy']:+.4f}, final train loss "
                      f"{b['train_loss'] - a['train_loss']:+.4f} (one seed: a sanity check that bf16 learns, not an ordering)."]
    for k, r in res.items():
        if r["fallback"]:
            lines.append(f"- {k}: stacking fell back to one-by-one: {r['fallback']}")
    return {"lines": lines, "figures": res}


# ----------------------------------------------------------------------------- stacked vs one-by-one

def _acc_args(ctx, s) -> SimpleNamespace:
    return SimpleNamespace(out_dir=str(Path(ctx["work"]) / "runs"), rounds=s["coh_rounds"], per_client=s["per_client"],
                           device=ctx["device"], threads=1 if ctx["device"] == "cpu" else 0, optimizer="sgd",
                           gpus_per_client=0)


def acc_config(ctx, s, workload, alg, k, mode) -> dict:
    from accelerator import config  # benchmarks/perf/accelerator.py: the CPU version's cells

    cfg = config(workload, alg, k, mode, _acc_args(ctx, s))
    if workload == "cnn":
        cfg["data"]["root"] = ctx["fashion"]
    return cfg


def sec_cohorts(ctx) -> dict:
    s, dev = sizes(ctx), torch.device(ctx["device"])
    cells = [(w, alg, k) for k in s["cohorts"] for w, alg in (("cnn", "fedavg"), ("cnn", "moon"), ("multimodal", "fedavg"))]
    res, skipped, t_cell = {}, [], 0.0
    for w, alg, k in cells:
        for mode in ("one-by-one", "stacked"):
            if left(ctx) < (3.0 if mode == "one-by-one" else 1.5) * t_cell + 3:  # a pair at a time
                skipped.append(f"{w} {alg} {k} {mode}")
                continue
            t = time.perf_counter()
            rows, timer = run_timed(acc_config(ctx, s, w, alg, k, mode), dev)
            wall, gpu = timer.steady()
            res[f"{w}|{alg}|{k}|{mode}"] = {"clients_per_s_wall": k / wall, "clients_per_s_gpu": (k / gpu) if gpu else None,
                                            "round_wall_s": wall, "round_gpu_s": gpu, "rounds_wall_s": timer.wall,
                                            "fallback": rows[-1].get("batched_fallback"),
                                            "accuracy": rows[-1].get("accuracy")}
            t_cell = max(t_cell, time.perf_counter() - t)
            print(f"{w} {alg} {k} {mode}: {k / wall:.1f} clients/s (wall)", flush=True)
            save_partial(ctx, _cohorts_report(s, cells, res, skipped))
    return _cohorts_report(s, cells, res, skipped)


def _cohorts_report(s, cells, res, skipped) -> dict:
    lines = [f"Cells of benchmarks/perf/accelerator.py (`config()`): cnn = MOON's simple CNN on Fashion-MNIST, "
             f"{s['per_client']} images per client; multimodal = MLP encoder per view on mfeat's six views; batch 32, "
             f"1 local epoch, SGD lr 0.01 momentum 0.9, {s['coh_rounds']} rounds, round 1 not counted. The same cohort "
             "each way. Clients/s = cohort / median round time; GPU = CUDA events around the round, wall = host clock "
             "after synchronize.", "",
             "| workload | algorithm | cohort | one-by-one clients/s (wall / GPU) | stacked clients/s (wall / GPU) "
             "| stacked / one-by-one (wall) |", "|---|---|---|---|---|---|"]
    for w, alg, k in cells:
        o, st = res.get(f"{w}|{alg}|{k}|one-by-one"), res.get(f"{w}|{alg}|{k}|stacked")
        cell = lambda r: "—" if r is None else f"{r['clients_per_s_wall']:.1f} / {fmt(r['clients_per_s_gpu'], '.1f')}"  # noqa: E731
        ratio = f"{st['clients_per_s_wall'] / o['clients_per_s_wall']:.2f}×" if o and st else "—"
        lines.append(f"| {w} | {alg} | {k} | {cell(o)} | {cell(st)} | {ratio} |")
    fb = sorted({r["fallback"] for r in res.values() if r["fallback"]})
    if fb:
        lines += ["", "Stacking fell back to one-by-one: " + "; ".join(fb)]
    if skipped:
        lines += ["", f"Not measured (the section's time ran out): {', '.join(skipped)}."]
    lines += ["", "Flower's Ray simulation: **not measured** — Ray's wheel alone is larger than the 64 MiB a device "
                  "call may carry, so it cannot be installed on the GPU machine (no package index there). The Flower "
                  "deployment path (SuperLink + SuperNodes on loopback) is measured in its own section."]
    return {"lines": lines, "figures": res}


# ----------------------------------------------------------------------------- Flower deployment

def sec_flower(ctx) -> dict:
    try:
        import flwr  # noqa: F401
    except Exception as e:  # noqa: BLE001  (a missing or broken install: one line)
        return {"lines": [f"Skipped: flwr does not import here ({type(e).__name__}: {e})."], "figures": {},
                "skipped": True}
    import mmfl
    from mmfl.config import apply_overrides, resolve
    from mmfl.flower import deploy

    binary, site_bin = "flower-superlink", Path(ctx.get("site") or "/nonexistent") / "bin"
    if (site_bin / binary).exists():
        deploy.BIN = site_bin  # the carried wheels' console scripts (pip install --target), first on PYTHONPATH
    elif not (deploy.BIN / binary).exists():
        return {"lines": [f"Skipped: {binary} is neither beside {sys.executable} nor in {site_bin}."],
                "figures": {}, "skipped": True}
    s, k, n = sizes(ctx), sizes(ctx)["flower_cohort"], sizes(ctx)["flower_nodes"]
    if ctx["smoke"] and not ctx.get("smoke_flower"):  # processes start in ~90 s on a loaded 2-core CPU: opt-in
        acc_config(ctx, s, "cnn", "fedavg", k, "one-by-one")
        return {"lines": [f"Skipped in smoke mode: flwr imports and {deploy.BIN / binary} exists; the deployment was "
                          "not started (MMFL_GPU_SMOKE_FLOWER=1 starts it)."], "figures": {}, "skipped": True}
    raw = acc_config(ctx, s | {"coh_rounds": s["flower_rounds"]}, "cnn", "fedavg", k, "one-by-one")
    raw["name"] = "flower-loopback"
    cfg = resolve(apply_overrides(mmfl.configure(raw).to_dict(),
                                  [f"output_dir={json.dumps(str(Path(raw['output_dir']).resolve()))}"]))
    work = Path(ctx["work"]) / "flower"
    t0 = time.perf_counter()
    with deploy.LocalDeployment(n, work, state_dir=cfg.run_dir / "node_state") as dep:
        up = time.perf_counter() - t0
        run_id = dep.submit(cfg, overwrite=True)
        status = dep.wait(run_id, timeout=max(5.0, left(ctx) - 5), poll=0.5, done_file=cfg.run_dir / "summary.json")
        if status != "finished:completed":
            tail = " ".join(dep.run_log(run_id)[-400:].split())
            raise RuntimeError(f"Flower run {run_id} {status}: {tail}")
    total = time.perf_counter() - t0
    from mmfl.report import load_metrics

    times = [r["train_time_s"] for r in load_metrics(cfg.run_dir)]
    steady = med(times[1:] or times)
    fig = {"cohort": k, "supernodes": n, "clients_per_s_wall": k / steady, "round_train_s": steady,
           "rounds_train_s": times, "startup_s": up, "total_s": total}
    lines = [f"`mmfl flower loopback`'s path (mmfl.flower.deploy.LocalDeployment): a SuperLink and {n} SuperNodes "
             f"as processes on 127.0.0.1, each ClientApp on {ctx['device']}; the cnn FedAvg cell at cohort {k} "
             f"(as in the table above), {s['flower_rounds']} rounds.", "",
             f"Clients/s (wall, cohort / median of rounds 2..: `train_time_s` of metrics.jsonl): "
             f"**{fig['clients_per_s_wall']:.1f}** (round {steady:.3f} s); deployment start {up:.1f} s; whole run "
             f"{total:.1f} s. Compare with the one-by-one and stacked cells at cohort {k} above (same config)."]
    return {"lines": lines, "figures": fig}


# ----------------------------------------------------------------------------- CreamFL public terms

def sec_public(ctx) -> dict:
    from mmfl.algorithms.public_terms import global_local_contrastive_aggregation

    s, dev = sizes(ctx), torch.device(ctx["device"])
    C, P, d = s["public"]
    g = torch.Generator(device=dev).manual_seed(0)
    local = torch.randn(C, P, d, device=dev, generator=g)
    local = local / local.norm(dim=-1, keepdim=True)
    glob = torch.randn(P, d, device=dev, generator=g)
    glob = glob / glob.norm(dim=-1, keepdim=True)
    cuda = dev.type == "cuda"

    def once() -> tuple[float, float | None]:
        if cuda:
            torch.cuda.synchronize(dev)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t = time.perf_counter()
        out, _ = global_local_contrastive_aggregation(local, glob)
        if cuda:
            b.record()
            torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t
        assert torch.isfinite(out).all() and out.shape == (P, d)
        return wall, (a.elapsed_time(b) / 1e3 if cuda else None)

    once()  # warm-up
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    reps = [once() for _ in range(s["public_reps"])]
    peak = (torch.cuda.max_memory_allocated(dev) - before) / 2**30 if cuda else None
    wall, gpu = med([r[0] for r in reps]), (med([r[1] for r in reps]) if cuda else None)
    flops = 2 * C * P * P * d
    fig = {"clients": C, "public": P, "dim": d, "wall_s": wall, "gpu_s": gpu, "tflop_per_s": flops / (gpu or wall) / 1e12,
           "peak_extra_gib": peak, "inputs_gib": (C * P * d + P * d) * 4 / 2**30,
           "full_matrix_gib_per_client": P * P * 4 / 2**30, "matmul_precision": torch.get_float32_matmul_precision()}
    lines = [f"mmfl.algorithms.public_terms.global_local_contrastive_aggregation (eq. 4–6, image side, chunk 1024) on "
             f"{C} clients × {P:,} public samples × {d} dims, fp32 (float32 matmul precision "
             f"'{fig['matmul_precision']}'), unit vectors drawn from a seeded generator (the cost does not depend on the "
             f"values); median of {s['public_reps']} after a warm-up.", "",
             f"Time: **{fmt(gpu, '.3f')} s GPU** / {wall:.3f} s wall; {fig['tflop_per_s']:.1f} TFLOP/s counting "
             f"2·C·P²·d for the logits; inputs {fig['inputs_gib']:.2f} GiB, peak extra device memory "
             f"{fmt(peak, '.2f')} GiB (the authors' full matrix: {fig['full_matrix_gib_per_client']:.1f} GiB per client)."]
    return {"lines": lines, "figures": fig}


# ----------------------------------------------------------------------------- MOON paper profile

def moon_grid(ctx, s):
    """grid-paper.toml, its runs, one run per method (the slice's setting, the first seed) and their order."""
    from mmfl.bench.gridfile import load_grid

    grid = load_grid(ROOT / "benchmarks" / "moon" / "grid-paper.toml")
    runs = grid.runs(None)
    rep = {}
    for r in runs:
        if r.setting == s["moon_setting"] and r.seed == runs[0].seed:
            rep.setdefault(r.method, r)
    order = [m for m in ("fedavg", "moon", "scaffold", "fedprox", "local") if m in rep]
    if ctx["smoke"]:
        order = [m for m in order if m in s["moon_methods"]]
    return grid, runs, rep, order


def moon_raw(ctx, s, run) -> dict:
    """The slice of one grid run: its config as the profile has it, ``moon_rounds`` rounds on the check's device."""
    raw = copy.deepcopy(run.raw)
    R = s["moon_rounds"]
    raw.update(device=ctx["device"], rounds=R, eval_every=R, output_dir=str(Path(ctx["work"]) / "runs"),
               name=f"moon-slice-{run.method}")
    raw["data"]["root"] = ctx["fashion"]
    if ctx["smoke"]:
        raw["data"].update(train_limit=s["moon_train"], test_limit=s["moon_test"])
        raw["train"]["local_epochs"] = 1
    return raw


def full_configs(ctx) -> dict[str, dict]:
    """Every run config the check trains at its GPU sizes, by name (tests resolve them on the CPU)."""
    s, ctx = FULL, dict(ctx, smoke=False)
    out = {f"precision-{p}": precision_cfg(ctx, s, p) for p in ("fp32", "bf16")}
    for k in s["cohorts"]:
        for w, alg in (("cnn", "fedavg"), ("cnn", "moon"), ("multimodal", "fedavg")):
            for mode in ("one-by-one", "stacked"):
                out[f"{w}-{alg}-{k}-{mode}"] = acc_config(ctx, s, w, alg, k, mode)
    out["flower-loopback"] = acc_config(ctx, s | {"coh_rounds": s["flower_rounds"]}, "cnn", "fedavg",
                                        s["flower_cohort"], "one-by-one")
    _, _, rep, order = moon_grid(ctx, s)
    out |= {f"moon-slice-{m}": moon_raw(ctx, s, rep[m]) for m in order}
    return out


def sec_moon(ctx) -> dict:
    import mmfl
    from mmfl.engine.runner import Experiment
    from mmfl.report import load_metrics

    s, dev = sizes(ctx), torch.device(ctx["device"])
    grid, runs, rep, order = moon_grid(ctx, s)
    R, meas, t_method = s["moon_rounds"], {}, 0.0
    for m in order:
        if meas and left(ctx) < 1.3 * t_method + 5:
            break
        t = time.perf_counter()
        exp = Experiment(mmfl.configure(moon_raw(ctx, s, rep[m])), progress=False)
        timer = RoundTimer(exp, dev)
        exp.run(overwrite=True)
        rows = load_metrics(exp.run_dir)
        wall, gpu = timer.steady()
        ev = [r["wall_time_s"] - r["train_time_s"] for r in rows if r.get("accuracy") is not None]
        meas[m] = {"round_wall_s": wall, "round_gpu_s": gpu, "eval_s": med(ev) if ev else 0.0,
                   "rounds_wall_s": timer.wall, "accuracy": rows[-1].get("accuracy"), "run_s": time.perf_counter() - t}
        t_method = max(t_method, meas[m]["run_s"])
        print(f"moon slice {m}: round {wall:.2f} s wall", flush=True)
        save_partial(ctx, _moon_report(ctx, s, grid, runs, rep, order, meas))
    return _moon_report(ctx, s, grid, runs, rep, order, meas)


def _moon_report(ctx, s, grid, runs, rep, order, meas) -> dict:
    R = s["moon_rounds"]
    like = {"fedprox": "fedavg", "scaffold": "fedavg", "local": "fedavg", "moon": "fedavg", "fedavg": "moon"}
    total, projected_from = 0.0, {}
    for r in runs:
        src = r.method if r.method in meas else like.get(r.method)
        if src not in meas:
            src = next(iter(meas), None)
        if src is None:
            break
        if src != r.method:
            projected_from[r.method] = src
        rounds, every = int(r.raw.get("rounds", 1)), int(r.raw.get("eval_every", 1) or 1)
        total += rounds * meas[src]["round_wall_s"] + max(1, rounds // every) * meas[src]["eval_s"]
    tr = rep[order[0]].raw["train"] if order else {}
    lines = [f"benchmarks/moon/grid-paper.toml ({len(runs)} runs: {grid.workers} worker(s)), one run per method at "
             f"β = {s['moon_setting']}, seed {runs[0].seed}, {R} rounds each on {ctx['device']}"
             + (" (smoke: a few hundred images, 1 local epoch)" if ctx["smoke"] else
                f" (as the profile says: the full training set over 10 clients, {tr.get('local_epochs')} local epochs, "
                "batch 64, stacked)") + "; round 1 not counted.", "",
             "| method | round wall (s) | round GPU (s) | evaluation (s) | accuracy after the slice |", "|---|---|---|---|---|"]
    for m, v in meas.items():
        lines.append(f"| {m} | {v['round_wall_s']:.2f} | {fmt(v['round_gpu_s'], '.2f')} | {v['eval_s']:.2f} "
                     f"| {fmt(v['accuracy'], '.4f')} |")
    if meas:
        lines += ["", f"Projected wall time of the whole grid ({sum(int(r.raw.get('rounds', 1)) for r in runs):,} rounds, "
                      f"one run at a time): **{total / 3600:.2f} h** (rounds × the method's steady round + evaluations "
                      "every eval_every rounds; data loading and round 1 not included)."]
    if projected_from:
        why = "smoke mode runs two" if ctx["smoke"] else "the section's time ran out"
        lines.append(f"Methods not measured ({why}), projected from (MOON's extra forward passes make it dearer "
                     "than FedAvg, so a MOON projected from FedAvg is low): "
                     + ", ".join(f"{k} ← {v}" for k, v in sorted(projected_from.items())) + ".")
    return {"lines": lines, "figures": {"methods": meas, "projected_s": total, "projected_from": projected_from,
                                        "runs": len(runs)}}


SECTIONS = {"precision": sec_precision, "cohorts": sec_cohorts, "public": sec_public,
            "moon": sec_moon, "flower": sec_flower}
