"""The measuring sections of the GPU check (benchmarks/perf/gpu_check.py runs each in a child process
under a time limit): each takes the check's context (device, smoke, data root, work folder, deadline)
and the sizes of gpu.toml and returns ``{"figures": {...}}`` (rendered by tables-gpu.toml) and, where
it has something to say in words (skipped, or the cohorts' own report), ``"lines"``. Rounds are timed
by mmfl.bench.roundtime (CPU, wall and, on CUDA, GPU time by CUDA events; round 1 pays one-off costs
and is left out of the medians); the cohorts are accelerator.py's cells.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]
import accelerator  # noqa: E402

from mmfl.bench.roundtime import run_timed, time_call  # noqa: E402

G = tomllib.loads((HERE / "gpu.toml").read_text())


def med(xs):
    return statistics.median(xs) if xs else None


def steady(times: list[dict]) -> tuple[float, float | None]:
    """Median wall and GPU seconds of the rounds after the first."""
    t = times[1:] or times
    return med([x["wall"] for x in t]), med([x["gpu"] for x in t if x["gpu"] is not None])


def run_cfg(ctx, cfg: dict) -> tuple[list[dict], list[dict]]:
    return run_timed(cfg, ctx["device"])[:2]  # metrics rows, per-round {cpu, wall, gpu}


def save_partial(ctx, res: dict) -> None:
    """What a section has measured so far (the driver reports it if the section is stopped)."""
    Path(ctx["work"], f"result-{ctx['section']}.json").write_text(json.dumps(res | {"partial": True}, default=str))


def precision_cfg(ctx, s, prec: str) -> dict:
    """gpu.toml's [precision] run at the sizes ``s`` in precision ``prec`` on the check's device."""
    cfg = copy.deepcopy(G["precision"]) | {"name": f"precision-{prec}", "precision": prec, "device": ctx["device"],
                                           "output_dir": str(Path(ctx["work"]) / "runs"), "rounds": s["prec_rounds"],
                                           "eval_every": s["prec_rounds"], "clients_per_round": s["prec_clients"]}
    cfg["data"] |= {"root": ctx["fashion"], "train_limit": s["prec_train"], "test_limit": s["prec_test"]}
    cfg["partition"]["num_clients"] = s["prec_clients"]
    return cfg | ({"threads": 1} if ctx["device"] == "cpu" else {})


def sec_precision(ctx, s) -> dict:
    res = {}
    for prec in ("fp32", "bf16"):
        rows, times = run_cfg(ctx, precision_cfg(ctx, s, prec))
        wall, gpu = steady(times)
        res[prec] = {"train_loss": rows[-1].get("train_loss"), "accuracy": rows[-1].get("accuracy"), "round_wall_s": wall,
                     "round_gpu_s": gpu, "fallback": rows[-1].get("batched_fallback"),
                     "losses": [r.get("train_loss") for r in rows]}
    return {"figures": res}


def acc_argv(ctx, s, rounds=None, device=None) -> list[str]:
    """accelerator.py's arguments for the check's cells (its run folders under the check's work folder)."""
    return ["--device", device or ctx["device"], "--cohorts", *map(str, s["cohorts"]),
            "--rounds", str(rounds or s["coh_rounds"]),
            "--per-client", str(s["per_client"]), "--modes", "one-by-one", "stacked", "--repeats", "1", "--no-profile",
            "--no-write", "--out-dir", str(Path(ctx["work"]) / "runs"),
            "--threads", "1" if ctx["device"] == "cpu" else "0"] \
        + (["--fashion", ctx["fashion"]] if ctx["fashion"] else [])


def acc_args(ctx, s, rounds=None):
    """accelerator.py's parsed arguments for ``ctx``'s device (not resolved: configs only)."""

    a = accelerator.parse(acc_argv(ctx, s, rounds, device="cpu"))
    a.device, a.threads = ctx["device"], 1 if ctx["device"] == "cpu" else 0
    return a


def sec_cohorts(ctx, s) -> dict:
    """accelerator.py's cells one-by-one and stacked (its report's tables, rewritten after every cell)."""
    from mmfl.bench.spec_data import render_doc

    def part(res: dict) -> dict:
        lines = render_doc(accelerator.SPEC, res)[2:]
        return {"figures": res["cells"], "lines": lines + [
            "Flower's Ray simulation: **not measured** — Ray's wheel alone is larger than the 64 MiB a device call may "
            "carry, so it cannot be installed on the GPU machine (no package index there). The Flower deployment path "
            "(SuperLink + SuperNodes on loopback) is measured in its own section."]}

    return part(accelerator.main(acc_argv(ctx, s), on_cell=lambda res: save_partial(ctx, part(res))))


def sec_flower(ctx, s) -> dict:
    try:
        import flwr  # noqa: F401
    except Exception as e:  # noqa: BLE001  (a missing or broken install: one line)
        return {"lines": [f"Skipped: flwr does not import here ({type(e).__name__}: {e})."], "figures": {}, "skipped": True}

    import mmfl
    from mmfl.config import apply_overrides, resolve
    from mmfl.flower import deploy
    from mmfl.report import load_metrics

    binary, site_bin = "flower-superlink", Path(ctx.get("site") or "/nonexistent") / "bin"
    if (site_bin / binary).exists():
        deploy.BIN = site_bin  # the carried wheels' console scripts (pip install --target), first on PYTHONPATH
    elif not (deploy.BIN / binary).exists():
        return {"lines": [f"Skipped: {binary} is neither beside {sys.executable} nor in {site_bin}."], "figures": {},
                "skipped": True}
    k, n = s["flower_cohort"], s["flower_nodes"]
    raw = accelerator.config("cnn", "fedavg", k, "one-by-one", acc_args(ctx, s, s["flower_rounds"]))
    if ctx["smoke"] and not ctx.get("smoke_flower"):  # processes start in ~90 s on a loaded 2-core CPU: opt-in
        mmfl.configure(raw)
        return {"lines": [f"Skipped in smoke mode: flwr imports and {deploy.BIN / binary} exists; the deployment was "
                          "not started (MMFL_GPU_SMOKE_FLOWER=1 starts it)."], "figures": {}, "skipped": True}
    raw["name"] = "flower-loopback"
    out_dir = json.dumps(str(Path(raw["output_dir"]).resolve()))
    cfg = resolve(apply_overrides(mmfl.configure(raw).to_dict(), [f"output_dir={out_dir}"]))
    t0 = time.perf_counter()
    with deploy.LocalDeployment(n, Path(ctx["work"]) / "flower", state_dir=cfg.run_dir / "node_state") as dep:
        up = time.perf_counter() - t0
        run_id = dep.submit(cfg, overwrite=True)
        status = dep.wait(run_id, timeout=max(5.0, ctx["deadline"] - time.time() - 5), poll=0.5,
                          done_file=cfg.run_dir / "summary.json")
        if status != "finished:completed":
            raise RuntimeError(f"Flower run {run_id} {status}: {' '.join(dep.run_log(run_id)[-400:].split())}")
    total, times = time.perf_counter() - t0, [r["train_time_s"] for r in load_metrics(cfg.run_dir)]
    st = med(times[1:] or times)
    return {"figures": {"cohort": k, "supernodes": n, "clients_per_s_wall": k / st, "round_train_s": st,
                        "rounds_train_s": times, "startup_s": up, "total_s": total}}


def sec_public(ctx, s) -> dict:
    import torch

    from mmfl.algorithms.public_terms import global_local_contrastive_aggregation

    dev, (C, P, d) = torch.device(ctx["device"]), s["public"]
    g, cuda = torch.Generator(device=dev).manual_seed(0), dev.type == "cuda"
    local, glob = torch.randn(C, P, d, device=dev, generator=g), torch.randn(P, d, device=dev, generator=g)
    local, glob = local / local.norm(dim=-1, keepdim=True), glob / glob.norm(dim=-1, keepdim=True)

    def once() -> dict:
        out, t = time_call(lambda: global_local_contrastive_aggregation(local, glob)[0], dev)
        assert torch.isfinite(out).all() and out.shape == (P, d)
        return t

    once()  # warm-up
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    reps = [once() for _ in range(s["public_reps"])]
    peak = (torch.cuda.max_memory_allocated(dev) - before) / 2**30 if cuda else None
    wall, gpu = med([r["wall"] for r in reps]), med([r["gpu"] for r in reps if r["gpu"] is not None])
    fig = {"clients": C, "public": P, "dim": d, "wall_s": wall, "gpu_s": gpu,
           "tflop_per_s": 2 * C * P * P * d / (gpu or wall) / 1e12,
           "peak_extra_gib": peak, "inputs_gib": (C * P * d + P * d) * 4 / 2**30,
           "full_matrix_gib_per_client": P * P * 4 / 2**30, "matmul_precision": torch.get_float32_matmul_precision()}
    return {"figures": fig}


def moon_grid(ctx, s):
    """grid-paper.toml's runs, one run per method (the slice's setting, the first seed) and their order."""
    from mmfl.bench.gridfile import load_grid

    grid = load_grid(ROOT / "benchmarks" / "moon" / "grid-paper.toml")
    runs, rep = grid.runs(None), {}
    for r in runs:
        if r.setting == s["moon_setting"] and r.seed == runs[0].seed:
            rep.setdefault(r.method, r)
    order = [m for m in ("fedavg", "moon", "scaffold", "fedprox", "local") if m in rep
             and (not ctx["smoke"] or m in s["moon_methods"])]
    return grid, runs, rep, order


def moon_raw(ctx, s, run) -> dict:
    """The slice of one grid run: its config as the profile has it, ``moon_rounds`` rounds on the check's device."""
    raw, R = copy.deepcopy(run.raw), s["moon_rounds"]
    raw.update(device=ctx["device"], rounds=R, eval_every=R, output_dir=str(Path(ctx["work"]) / "runs"),
               name=f"moon-slice-{run.method}")
    raw["data"]["root"] = ctx["fashion"]
    if ctx["smoke"]:
        raw["data"].update(train_limit=s["moon_train"], test_limit=s["moon_test"])
        raw["train"]["local_epochs"] = 1
    return raw


def sec_moon(ctx, s) -> dict:
    grid, runs, rep, order = moon_grid(ctx, s)
    meas, t_method = {}, 0.0
    for m in order:
        if meas and ctx["deadline"] - time.time() < 1.3 * t_method + 5:
            break
        t = time.perf_counter()
        rows, times = run_cfg(ctx, moon_raw(ctx, s, rep[m]))
        wall, gpu = steady(times)
        ev = [r["wall_time_s"] - r["train_time_s"] for r in rows if r.get("accuracy") is not None]
        meas[m] = {"round_wall_s": wall, "round_gpu_s": gpu, "eval_s": med(ev) or 0.0,
                   "rounds_wall_s": [x["wall"] for x in times],
                   "accuracy": rows[-1].get("accuracy"), "run_s": time.perf_counter() - t}
        t_method = max(t_method, meas[m]["run_s"])
        save_partial(ctx, _moon_report(ctx, s, grid, runs, rep, order, meas))
    return _moon_report(ctx, s, grid, runs, rep, order, meas)


def _moon_report(ctx, s, grid, runs, rep, order, meas) -> dict:
    """The measured methods and the grid's projected wall time (a method not measured: from a similar one)."""
    like = {"fedprox": "fedavg", "scaffold": "fedavg", "local": "fedavg", "moon": "fedavg", "fedavg": "moon"}
    total, projected_from = 0.0, {}
    for r in runs if meas else []:
        src = r.method if r.method in meas else like.get(r.method) if like.get(r.method) in meas else next(iter(meas))
        if src != r.method:
            projected_from[r.method] = src
        rounds, every = int(r.raw.get("rounds", 1)), int(r.raw.get("eval_every", 1) or 1)
        total += rounds * meas[src]["round_wall_s"] + max(1, rounds // every) * meas[src]["eval_s"]
    return {"figures": {"methods": meas, "projected_s": total, "projected_h": total / 3600, "runs": len(runs),
                        "projected_from": dict(sorted(projected_from.items())), "workers": grid.workers,
                        "seed": runs[0].seed, "rounds": sum(int(r.raw.get("rounds", 1)) for r in runs),
                        "local_epochs": (rep[order[0]].raw["train"] if order else {}).get("local_epochs")}}


SECTIONS = {"precision": sec_precision, "cohorts": sec_cohorts,
            "public": sec_public, "moon": sec_moon, "flower": sec_flower}


def full_configs(ctx) -> dict[str, dict]:
    """Every run config the check trains at its GPU sizes, by name (tests resolve them on the CPU)."""
    s, ctx = G["full"], dict(ctx, smoke=False)
    a = acc_args(ctx, s)
    out = {f"precision-{p}": precision_cfg(ctx, s, p) for p in ("fp32", "bf16")}
    out |= {"-".join(map(str, c)): accelerator.config(*c, a) for c in accelerator.plan(a)}
    out["flower-loopback"] = accelerator.config("cnn", "fedavg", s["flower_cohort"], "one-by-one", a)
    _, _, rep, order = moon_grid(ctx, s)
    return out | {f"moon-slice-{m}": moon_raw(ctx, s, rep[m]) for m in order}


