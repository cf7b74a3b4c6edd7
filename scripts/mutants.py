"""Mechanism mutations: break each mechanism in a copy of the code and check its tests fail.

    .venv/bin/python scripts/mutants.py                  # every mutation of tests/mutations/*.toml
    .venv/bin/python scripts/mutants.py --fast           # the CI subset (fast = true)
    .venv/bin/python scripts/mutants.py --only moon-negative-pair scaffold-sign
    .venv/bin/python scripts/mutants.py --list           # the declared mutations, nothing run
    .venv/bin/python scripts/mutants.py --doc            # rewrite docs/mechanisms.md's "Mutation checks" table
    .venv/bin/python scripts/mutants.py --jobs 2         # two mutations at a time

The list is every ``tests/mutations/*.toml``: ``[[mutation]]`` entries with ``name`` (unique,
kebab-case), ``mechanism`` (what it breaks, in the paper's terms), ``file`` (from the repository
root), ``find`` (source text occurring exactly once in ``file``), ``replace`` (text that still runs
but removes the mechanism), ``tests`` (pytest node ids; at least one must fail) and ``fast``
(part of the CI subset). A stale entry (unknown key, duplicate name, ``find`` not found exactly
once, a test that does not exist) is one error line and exit 2, before anything runs.

How: the repository's files (``git ls-files``: tracked and untracked-not-ignored) are copied
into a temporary folder; the selected tests run there once unmutated (each must pass, or its
entry is broken); then each mutation gets its own copy of that folder with ``find`` replaced,
and its tests run there with ``-x`` (each pytest process first asserts that ``mmfl`` is
imported from that copy, not from the editable install; one mutation at a time, each test
process is forked from the runner after it imported torch once: MMFL_MUTANTS_FORK=0 starts a
fresh interpreter instead). A mutation whose tests all pass
SURVIVED. The working tree is never written. Exit 0: every mutation killed; 1: one survived
(or a test errored); 2: the list is invalid.

Why not mutmut: mutmut generates random mutants of whole files (operator swaps, constants) and
reports a score; here each mutation is a declared removal of one paper mechanism tied to the
test that must catch it, so the list itself is the documentation (docs/mechanisms.md renders
it) and a survivor names the missing test. A declared list needs only find/replace in a copy.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST_DIR = ROOT / "tests" / "mutations"
DOC = ROOT / "docs" / "mechanisms.md"
BEGIN, END = "<!-- mutants:begin (scripts/mutants.py --doc writes this table) -->", "<!-- mutants:end -->"
KEYS = {"name", "mechanism", "file", "find", "replace", "tests", "fast"}
NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# run before pytest in each subprocess: the code under test must be the copy's
GUARD = ("import os, sys; sys.path.insert(0, os.getcwd()); import mmfl; "
         "here = os.path.realpath(os.path.dirname(mmfl.__file__)); "
         "want = os.path.realpath(os.path.join(os.getcwd(), 'mmfl')); "
         "assert here == want, f'mmfl imported from {here}, not from the copy {want}'; "
         "import pytest; sys.exit(pytest.main(sys.argv[1:]))")
PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "-rfE", "-n", "0"]


STOP = threading.Event()


class ListError(Exception):
    """An invalid entry of the mutation list (one line)."""


def load(list_dir: Path = LIST_DIR, root: Path = ROOT) -> list[dict]:
    """Every entry of ``list_dir/*.toml``, validated against ``root`` (raises :class:`ListError`)."""
    entries, seen = [], {}
    files = sorted(list_dir.glob("*.toml"))
    if not files:
        raise ListError(f"{list_dir}: no *.toml mutation lists")
    for f in files:
        where = f.relative_to(root) if f.is_relative_to(root) else f
        try:
            data = tomllib.loads(f.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ListError(f"{where}: not valid TOML ({e})") from None
        if set(data) - {"mutation"}:
            raise ListError(f"{where}: unknown table(s) {sorted(set(data) - {'mutation'})} (only [[mutation]])")
        for i, e in enumerate(data.get("mutation", [])):
            at = f"{where}: mutation {e.get('name', f'#{i + 1}')!r}"
            unknown, missing = set(e) - KEYS, KEYS - set(e)
            if unknown or missing:
                raise ListError(f"{at}: unknown keys {sorted(unknown)}" if unknown else f"{at}: missing {sorted(missing)}")
            for k in ("name", "mechanism", "file", "find", "replace"):
                if not isinstance(e[k], str) or not e[k]:
                    raise ListError(f"{at}: '{k}' must be a non-empty string")
            if not NAME.match(e["name"]):
                raise ListError(f"{at}: name must be kebab-case (a-z, 0-9, '-')")
            if e["name"] in seen:
                raise ListError(f"{at}: duplicate name (also in {seen[e['name']]})")
            seen[e["name"]] = where
            if not isinstance(e["fast"], bool):
                raise ListError(f"{at}: 'fast' must be true or false")
            if not (isinstance(e["tests"], list) and e["tests"] and all(isinstance(t, str) for t in e["tests"])):
                raise ListError(f"{at}: 'tests' must be a non-empty list of pytest node ids")
            if e["find"] == e["replace"]:
                raise ListError(f"{at}: 'replace' equals 'find'")
            src = root / e["file"]
            if not src.is_file():
                raise ListError(f"{at}: file {e['file']} does not exist")
            text = src.read_text()
            n = text.count(e["find"])
            if n != 1:
                raise ListError(f"{at}: 'find' occurs {n} times in {e['file']} (must be exactly once: stale entry?)")
            if src.suffix == ".py":
                try:
                    compile(text.replace(e["find"], e["replace"]), e["file"], "exec")
                except SyntaxError as err:
                    raise ListError(f"{at}: the mutated {e['file']} does not compile ({err.msg}, line {err.lineno})") from None
            for t in e["tests"]:
                check_node(root, t, at)
            entries.append({**e, "list": str(where)})
    return entries


def check_node(root: Path, node: str, at: str) -> None:
    """``tests/x.py::[Class::]name[params]``: the file exists and defines the function (and class)."""
    parts = node.split("::")
    path = root / parts[0]
    if len(parts) < 2 or not path.is_file():
        raise ListError(f"{at}: test {node!r} is not a node id of an existing file (tests/x.py::name)")
    text = path.read_text()
    for cls in parts[1:-1]:
        if not re.search(rf"^class {re.escape(cls)}\b", text, re.M):
            raise ListError(f"{at}: test {node!r}: no class {cls} in {parts[0]}")
    func = parts[-1].split("[", 1)[0]
    if not re.search(rf"^\s*(async )?def {re.escape(func)}\(", text, re.M):
        raise ListError(f"{at}: test {node!r}: no function {func} in {parts[0]}")


def copy_repo(dest: Path, src: Path = ROOT) -> None:
    """The repository's tracked and untracked-not-ignored files into ``dest`` (no .git, .venv, runs)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=src, check=True,
                             capture_output=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but the usual clutter
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "__pycache__", "*.pyc",
                                                                 ".pytest_cache", ".cache", "*.egg-info"))
        return
    for rel in filter(None, out.split("\0")):
        s = src / rel
        if s.is_file() and not s.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, dest / rel)


def env_for(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not an xdist worker of a caller
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


# Each pytest process spends most of its start importing torch (about 1.7 s of CPU of ~3 s);
# with one mutation at a time the runner imports torch, numpy and pytest once and forks each
# test process from itself (mmfl is never imported here, so the child imports the copy's).
# MMFL_MUTANTS_FORK=0, --jobs > 1 or a platform without fork: a fresh interpreter per process.
WARM = ("torch", "numpy", "safetensors", "pytest")


def _fork_pytest(copy: Path, args: list[str], timeout: float, procs: set) -> tuple[int, str]:
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the test process: its own session, output to the pipe, the copy's mmfl
        code = 1
        try:
            os.setsid()
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            os.chdir(copy)
            env = env_for(copy)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["pytest", *args]
            sys.path[0] = ""  # as for ``python -c``: the working directory (the copy) first
            exec(compile(GUARD, "<mutants guard>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported in the output, exit 3 (an error, not a kill)
            import traceback
            traceback.print_exc()
            code = 3
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    proc = type("Forked", (), {"pid": pid})()  # in procs like a Popen: its own session, ended by killpg
    procs.add(proc)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(r, 65536), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.killpg(pid, 9)
                os.waitpid(pid, 0)
                rc = -1
                break
            time.sleep(0.05)
    except BaseException:  # Ctrl-C while waiting: end the test process's session here
        os.killpg(pid, 9)
        os.waitpid(pid, 0)
        raise
    finally:
        procs.discard(proc)
    reader.join(timeout=10)
    os.close(r)
    return rc, b"".join(chunks).decode(errors="replace")


FORK = False  # set by run(fork=True) (the script): one mutation at a time on a platform with fork


def run_pytest(copy: Path, tests: list[str], stop_first: bool, timeout: float, procs: set) -> tuple[int, str, float]:
    """``(exit code, output, seconds)`` of the tests in ``copy`` (exit -1: timed out)."""
    cmd = [sys.executable, "-c", GUARD, *PYTEST_ARGS, *(["-x"] if stop_first else []), *tests]
    t0 = time.perf_counter()
    if STOP.is_set():  # interrupted: start nothing new
        return -2, "", 0.0
    if FORK:
        rc, out = _fork_pytest(copy, cmd[3:], timeout, procs)
        return rc, out, time.perf_counter() - t0
    p = subprocess.Popen(cmd, cwd=copy, env=env_for(copy), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    procs.add(p)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, rc = p.communicate()[0], -1
    except BaseException:  # Ctrl-C while waiting: the tests run in their own session, end them here
        os.killpg(p.pid, 9)
        p.wait()
        raise
    finally:
        procs.discard(p)
    return rc, out, time.perf_counter() - t0


def failed_tests(output: str) -> list[str]:
    return [line.split(" ", 1)[1].split(" - ", 1)[0] for line in output.splitlines()
            if line.startswith(("FAILED ", "ERROR "))]


def mutate(base: Path, dest: Path, e: dict) -> None:
    shutil.copytree(base, dest, symlinks=True)
    f = dest / e["file"]
    f.write_text(f.read_text().replace(e["find"], e["replace"], 1))


def run(entries: list[dict], jobs: int, timeout: float, fork: bool = False) -> int:
    """``fork``: fork the test processes (main() asks for it when run as a script; a caller that
    imported mmfl, such as a test calling run() in process, must not fork: the copy's mmfl)."""
    global FORK
    FORK = (fork and jobs == 1 and hasattr(os, "fork") and "mmfl" not in sys.modules
            and os.environ.get("MMFL_MUTANTS_FORK", "1") != "0")
    if FORK:
        import importlib
        for name in WARM:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
    procs: set = set()
    tmp = Path(tempfile.mkdtemp(prefix="mmfl-mutants-"))
    try:
        base = tmp / "base"
        copy_repo(base)
        tests = sorted({t for e in entries for t in e["tests"]})
        print(f"baseline: {len(tests)} tests unmutated ...", flush=True)
        rc, out, sec = run_pytest(base, tests, False, timeout * 2, procs)
        if rc != 0:
            bad = failed_tests(out)
            print(out[-3000:])
            for e in entries:
                mine = [f for f in bad if any(f == t or f.startswith(t + "[") for t in e["tests"])]
                if mine or not bad:
                    print(f"mutants: error: {e['list']}: mutation {e['name']!r}: its tests fail unmutated "
                          f"({', '.join(mine) or f'pytest exit {rc}'})")
            return 2
        print(f"baseline: passed in {sec:.0f} s", flush=True)

        def one(ie):
            i, e = ie
            dest = tmp / f"m{i}"
            mutate(base, dest, e)
            try:
                rc, out, sec = run_pytest(dest, e["tests"], True, timeout, procs)
            finally:
                shutil.rmtree(dest, ignore_errors=True)
            status = {0: "SURVIVED", 1: "killed", -1: "timeout"}.get(rc, f"error (pytest exit {rc})")
            failed = failed_tests(out)
            row = (e["name"], status, sec, failed[0] if failed else "")
            print(f"  {row[0]:<38} {row[1]:<10} {row[2]:6.1f} s  {row[3]}", flush=True)
            if status.startswith(("error", "timeout")):
                print("\n".join(out.splitlines()[-15:]))
            return row

        print(f"{len(entries)} mutations, {jobs} at a time:", flush=True)
        pool = ThreadPoolExecutor(max_workers=jobs)
        try:
            rows = list(pool.map(one, enumerate(entries)))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        print(f"\n| mutation | result | s | failing test |\n|---|---|---|---|")
        for name, status, sec, test in rows:
            print(f"| {name} | {status} | {sec:.1f} | {test or '-'} |")
        survived = [r[0] for r in rows if r[1] != "killed"]
        total = sum(r[2] for r in rows) + sec
        print(f"\n{len(rows) - len(survived)} of {len(rows)} killed; {total:.0f} s of test processes")
        if survived:
            print(f"mutants: not killed: {', '.join(survived)}")
        return 1 if survived else 0
    except KeyboardInterrupt:
        STOP.set()
        for p in list(procs):
            os.killpg(p.pid, 9)
        print("mutants: interrupted (the working tree was not modified)")
        return 130
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def code(text: str) -> str:
    """A markdown table cell's inline code for ``text`` (newlines as ⏎, pipes escaped)."""
    t = " ⏎ ".join(line.strip() for line in text.strip("\n").splitlines()).replace("|", "\\|")
    tick = "``" if "`" in t else "`"
    return f"{tick}{' ' if tick == '``' else ''}{t}{' ' if tick == '``' else ''}{tick}"


def render(entries: list[dict]) -> str:
    rows = ["| mutation | mechanism | where: find → replace | tests that must fail | fast |", "|---|---|---|---|---|"]
    for e in sorted(entries, key=lambda e: (e["list"], e["name"])):
        tests = ", ".join(f"`{t.removeprefix('tests/')}`" for t in e["tests"])
        rows.append(f"| `{e['name']}` | {e['mechanism'].replace('|', chr(92) + '|')} | `{e['file']}`: {code(e['find'])} → "
                    f"{code(e['replace'])} | {tests} | {'yes' if e['fast'] else ''} |")
    return "\n".join(rows)


def doc_with(entries: list[dict], text: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ListError(f"{DOC.relative_to(ROOT)}: needs the markers {BEGIN!r} and {END!r} once each")
    head, rest = text.split(BEGIN)
    return f"{head}{BEGIN}\n{render(entries)}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fast", action="store_true", help="only the entries with fast = true (the CI subset)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these mutations")
    ap.add_argument("--list", action="store_true", help="print the declared mutations and exit")
    ap.add_argument("--doc", action="store_true", help="rewrite the table in docs/mechanisms.md and exit")
    ap.add_argument("--jobs", type=int, default=1, help="mutations run at a time (default 1)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutation's tests (default 900)")
    a = ap.parse_args(argv)
    try:
        entries = load()
        if a.only:
            unknown = sorted(set(a.only) - {e["name"] for e in entries})
            if unknown:
                raise ListError(f"--only: no mutation named {', '.join(unknown)} (--list shows them)")
            entries = [e for e in entries if e["name"] in a.only]
        if a.fast:
            entries = [e for e in entries if e["fast"]]
        if a.doc:
            DOC.write_text(doc_with(load(), DOC.read_text()))
            print(f"{DOC.relative_to(ROOT)}: {len(load())} mutations")
            return 0
    except ListError as err:
        print(f"mutants: error: {err}", file=sys.stderr)
        return 2
    if a.jobs < 1:
        print("mutants: error: --jobs must be >= 1", file=sys.stderr)
        return 2
    if a.list:
        for e in entries:
            print(f"{e['name']:<38} {'fast' if e['fast'] else '    '}  {e['file']}  ({e['list']})")
        return 0
    if not entries:
        print("mutants: error: no mutation selected", file=sys.stderr)
        return 2
    return run(entries, a.jobs, a.timeout, fork=True)


if __name__ == "__main__":
    sys.exit(main())
