"""Running many configs: a pool of worker processes, each run in its own spawned process
with one torch thread, progress on stdout, a record of the invocation. The benchmark
scripts (``benchmarks/*/run.py``) build their configs and call :func:`run_missing`."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable


def run_one(name: str, raw: dict, raw_dir: str, post: Callable | None = None,
            reuse_finished: bool = False, runner: Callable | None = None) -> tuple[str, float, str | None]:
    """Run one raw config as ``raw_dir/name`` in this process with one torch thread (a
    :func:`run_pool` worker). ``post(raw, cfg, run_dir, exp)`` runs afterwards (its extra
    files; ``exp`` is None when ``reuse_finished`` skipped a run whose summary.json exists).
    ``runner(raw, cfg, run_dir)``, if given, runs the run instead of mmfl's simulator (another
    transport; ``exp`` is then None). A failure is recorded in ``run_dir/failed.txt`` and
    returned, not raised; a success removes an old failed.txt. Returns ``(name, seconds, error or None)``."""
    import torch

    from mmfl.config import resolve
    from mmfl.engine.runner import Experiment

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    d = Path(raw_dir) / name
    try:
        cfg = resolve(dict(raw, name=name, output_dir=str(raw_dir)))
        exp = None
        if not (reuse_finished and (d / "summary.json").exists()):
            # this sweep's own record of an earlier failure is no run: --overwrite would refuse the folder
            (d / "failed.txt").unlink(missing_ok=True)
            if runner is not None:
                runner(raw, cfg, d)
            else:
                exp = Experiment(cfg, progress=False)
                exp.run(overwrite=True)
        if post is not None:
            from mmfl.engine import runfiles

            before = set(d.rglob("*"))
            post(raw, cfg, d, exp)
            # its files are this run's (mmfl wrote them): what a later --overwrite may delete
            runfiles.record(d, *sorted(p.relative_to(d).as_posix() for p in d.rglob("*")
                                       if p.is_file() and p not in before))
        (d / "failed.txt").unlink(missing_ok=True)
        return name, time.perf_counter() - t0, None
    except Exception as e:  # a failed run is recorded and reported, not fatal
        d.mkdir(parents=True, exist_ok=True)
        (d / "failed.txt").write_text(f"{type(e).__name__}: {e}\n")
        return name, time.perf_counter() - t0, f"{type(e).__name__}: {e}"


def run_missing(label: str, runs: list[tuple[str, dict]], raw_dir: Path, workers: int,
                warm: list[dict], done: Callable[[str, dict], bool] | None = None,
                post: Callable | None = None, reuse_finished: bool = False, runner: Callable | None = None) -> int:
    """Run the ``(name, raw config)`` of ``runs`` that are not ``done`` (default: their
    summary.json exists) with :func:`run_one` in a :func:`run_pool`, after loading the data
    sets of the ``warm`` configs once (:func:`warm_caches`). Returns how many it ran."""
    from functools import partial

    done = done or (lambda name, raw: (Path(raw_dir) / name / "summary.json").exists())
    todo = [(n, r) for n, r in runs if not done(n, r)]
    print(f"{label} benchmark: {len(runs)} runs planned, {len(runs) - len(todo)} finished, "
          f"{len(todo)} to do, {workers} workers", flush=True)
    if not todo:
        return 0
    warm_caches(warm)
    return run_pool(todo, partial(run_one, post=post, reuse_finished=reuse_finished, runner=runner), raw_dir, workers)


def run_pool(todo: list[tuple[str, dict]], run_one: Callable[[str, dict, str], tuple[str, float, str | None]],
             raw_dir: Path, workers: int, progress: bool = False) -> int:
    """Run ``run_one(name, raw_config, raw_dir) -> (name, seconds, error or None)`` for every
    ``(name, raw_config)`` of ``todo`` in ``workers`` spawned processes (``run_one`` must be a
    module-level function); print each result as it finishes (``progress``: a bar over the runs,
    done/total and ETA, with a line per failure) and write ``raw_dir/last_invocation.json``
    (runs, wall and summed run seconds, load). Ctrl-C stops the workers (finished runs stay,
    an unfinished one is run again next time) and re-raises. Returns the number of runs."""
    t0 = time.perf_counter()
    secs: list[float] = []
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), unit="run", desc="runs", dynamic_ncols=True)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(run_one, name, raw, str(raw_dir)) for name, raw in todo]
        for i, fut in enumerate(as_completed(futures), 1):
            name, sec, err = fut.result()
            secs.append(sec)
            el = time.perf_counter() - t0
            if bar is not None:
                bar.update(1)
                if err:
                    bar.write(f"{name}: FAILED {err}")
                continue
            status = f"FAILED {err}" if err else f"{sec:.1f}s"
            print(f"[{i}/{len(todo)}] {name}: {status} (elapsed {el / 60:.1f} min, "
                  f"~{el / i * (len(todo) - i) / 60:.1f} min left)", flush=True)
    except BaseException:  # Ctrl-C (or a worker lost): no new runs, the running ones stopped
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    pool.shutdown()
    (Path(raw_dir) / "last_invocation.json").write_text(json.dumps(
        {"runs": len(todo), "wall_s": time.perf_counter() - t0, "workers": workers, "run_s_sum": sum(secs),
         "load_average_at_start": load, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
    return len(todo)


def machine() -> str:
    """``"<n> CPUs (<model>), Python x.y.z, torch v, one torch thread per run"``."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, torch {torch.__version__}, "
            "one torch thread per run")


def verdict(a: list[float], b: list[float], scale: float = 1.0) -> tuple[float, float, str]:
    """A claim "a > b" over seeds: ``(delta, spread, text)`` with delta = (mean(a) - mean(b)) x
    ``scale`` and spread = (std(a) + std(b)) x ``scale`` (NaN for one seed). The claim *holds*
    or is *reversed*, *beyond the spread* when |delta| > spread, else *within* it."""
    import numpy as np

    d = float(np.mean(a) - np.mean(b)) * scale
    spread = float(np.std(a) + np.std(b)) * scale if len(a) > 1 and len(b) > 1 else float("nan")
    if abs(d) < 1e-9:
        return d, spread, "tie"
    if np.isnan(spread):
        return d, spread, "holds (1 seed)" if d > 0 else "reversed (1 seed)"
    if d > spread:
        return d, spread, "holds, beyond the spread"
    if d > 0:
        return d, spread, "holds, within the spread"
    if -d > spread:
        return d, spread, "**reversed**, beyond the spread"
    return d, spread, "reversed, within the spread"


def paired_verdict(a: list[float], b: list[float], scale: float = 1.0, n_boot: int = 10_000,
                   level: float = 0.95, rng=None) -> dict:
    """A claim "a > b" over *paired* seeds (``a[i]`` and ``b[i]`` ran with the same seed: same
    partition, initialisation and sampling). Returns ``delta`` (mean of the per-seed differences
    x ``scale``), ``lo``/``hi`` (the percentile bootstrap ``level`` confidence interval of that
    mean, ``n_boot`` resamples of the seeds, a fixed generator, or ``rng`` to draw a table's rows from one), ``p`` (two-sided paired t-test,
    ``scipy.stats.ttest_rel``), ``n`` and ``text``: the claim *holds* when the interval lies
    above 0 and p < 0.05, is **reversed** when the interval lies below 0 and p < 0.05, else it
    is *unresolved*; ``word`` is that verdict alone (holds / **reversed** / unresolved / not testable),
    the one place the kinds of :mod:`mmfl.bench` take it from. Both are asked for because a bootstrap over 5 seeds alone is too narrow
    (it never reaches beyond the observed differences). Fewer than 2 pairs: ``text`` says so."""
    import numpy as np
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired_verdict: {len(a)} values against {len(b)}; pair them by seed")
    d = (np.asarray(a, dtype=float) - np.asarray(b, dtype=float)) * scale
    n = len(d)
    out = {"delta": float(d.mean()) if n else float("nan"), "lo": float("nan"), "hi": float("nan"),
           "p": float("nan"), "n": n}
    if n < 2:
        out["word"] = "not testable"
        out["text"] = f"not testable ({n} paired seed{'s' if n != 1 else ''})"
        return out
    rng = np.random.default_rng(0) if rng is None else rng
    means = d[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    out["lo"], out["hi"] = (float(np.quantile(means, q)) for q in ((1 - level) / 2, (1 + level) / 2))
    if np.ptp(d) > 0:
        out["p"] = float(stats.ttest_rel(np.asarray(a, dtype=float), np.asarray(b, dtype=float)).pvalue)
    elif d[0] != 0:
        out["p"] = 0.0
    else:
        out["p"] = 1.0
    ci = f"95% CI [{out['lo']:+.1f}, {out['hi']:+.1f}], p = {out['p']:.3f}, n = {n}"
    if out["lo"] > 0 and out["p"] < 0.05:
        out["word"] = "holds"
    elif out["hi"] < 0 and out["p"] < 0.05:
        out["word"] = "**reversed**"
    else:
        out["word"] = "unresolved"
    out["text"] = f"{out['word']} ({ci})"
    return out


def spread_text(spread: float, digits: int = 1) -> str:
    """A spread for a table cell ("—" for one seed)."""
    return "—" if spread != spread else f"{spread:.{digits}f}"


def warm_caches(raw_configs: list[dict]) -> None:
    """Load every data set of these configs once (``[data]`` and ``[[client_data]]``), so
    features computed and cached on first use are there before the workers race to fill
    the caches."""
    from mmfl.config import resolve
    from mmfl.data import DATASETS

    seen = set()
    for raw in raw_configs:
        cfg = resolve(raw)
        for comp in [cfg.data, *[e.data for e in cfg.client_data]]:
            key = (comp.name, repr(comp.params))
            if key not in seen:
                seen.add(key)
                DATASETS.get(comp.name).factory(comp.params)
