"""Run-folder safety: one writer at a time, ``--overwrite`` only of mmfl runs, and
filesystem errors as one line.

- :class:`RunLock`: an exclusive ``flock`` on ``<run folder>/.lock`` held while a run
  writes the folder; the file holds the holder's pid. A second writer fails at once with
  one line naming the folder and that pid. The kernel drops the lock when the process
  exits or dies, so a crash leaves nothing to clean up (the file stays; it is never
  deleted, which would let two writers lock two different files).
- :func:`is_run_folder`: whether a folder looks like an mmfl run (``--overwrite`` asks
  :mod:`mmfl.engine.runfiles` instead: the marker and the list of files the run wrote).
- :func:`fs_error`: an ``OSError`` (a full disk, a path that is a file, a read-only or
  pseudo file system) as one :class:`~mmfl.errors.MMFLError` line.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import fcntl
import json
import os
import sys
import tomllib
from pathlib import Path

import tomli_w

from mmfl.engine import runfiles
from mmfl.errors import MMFLError
from mmfl.schema import COMPONENTS, ExperimentConfig

LOCK = ".lock"


class RunLock:
    """``with RunLock(run_dir):`` -- the folder (created if missing) is this process's to write."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise MMFLError(f"{self.run_dir}: run folder is in use by another mmfl process (pid {holder}); "
                            "wait for it to finish, or use --set name=<new name>") from None
        except OSError as e:  # a file system without locks (ENOLCK, EOPNOTSUPP): say so, go on
            print(f"mmfl: warning: {self.run_dir}: cannot lock the run folder ({e.strerror}); "
                  "nothing stops a second process writing it", file=sys.stderr)
            os.close(fd)
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def contents(run_dir: Path) -> list[Path]:
    """What the folder holds, its lock file aside ([] when it does not exist)."""
    if not run_dir.is_dir():
        return []
    return [p for p in run_dir.iterdir() if p.name != LOCK]


def is_run_folder(run_dir: Path) -> bool:
    """Whether mmfl wrote this folder: a ``config.toml`` with mmfl's top-level ``rounds`` and
    ``[algorithm]``, or a ``metrics.jsonl`` of round rows, or ``checkpoints/round_*``."""
    try:
        raw = tomllib.loads((run_dir / "config.toml").read_text())
        if "rounds" in raw and isinstance(raw.get("algorithm"), dict):
            return True
    except (OSError, ValueError):
        pass
    try:
        with open(run_dir / "metrics.jsonl") as f:
            row = json.loads(f.readline())
        if isinstance(row, dict) and "round" in row:
            return True
    except (OSError, ValueError):
        pass
    ckpts = run_dir / "checkpoints"
    return ckpts.is_dir() and any(ckpts.glob("round_*"))


def fs_error(e: OSError, run_dir: Path) -> MMFLError:
    """``e`` as one line naming the path and what to do."""
    where = e.filename or run_dir
    what = e.strerror or str(e)
    if e.errno == errno.ENOSPC:
        hint = "the run folder keeps its last complete checkpoint; free space, then --resume"
    elif e.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        hint = f"output_dir/name ({run_dir}) must be a folder or a path where one can be created"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
        hint = f"output_dir/name ({run_dir}) must be a folder mmfl can write"
    else:
        hint = f"while writing the run folder {run_dir}"
    return MMFLError(f"{where}: {what} ({hint})")


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync'ed and renamed into place: a crash
    leaves the old file or the new one, never half of one. Inside a run folder the path is
    recorded first (:func:`mmfl.engine.runfiles.note`: what ``--overwrite`` may delete)."""
    runfiles.note(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # the old file stays as it was
        raise
    os.replace(tmp, path)


def load_saved_config(path: Path) -> dict:
    """A run folder's config.toml as a dict; one MMFLError line when it is damaged."""
    try:
        return tomllib.loads(path.read_text())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise MMFLError(f"{path}: the saved config is damaged ({str(e).splitlines()[0]}); restore it to "
                        "resume, or start over with --overwrite") from None


def truncate_metrics(path: Path, start: int) -> None:
    """Keep only rows of rounds before ``start`` (a half-written round is dropped)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("round", 0) <= start:
            keep.append(line)
    atomic_write(path, "".join(k + "\n" for k in keep))


def with_new_defaults(saved: dict, cfg: ExperimentConfig) -> dict:
    """``saved`` (a run folder's config.toml) with every setting it lacks that ``cfg``'s
    dataclasses declare set to that field's default: a run written by an older mmfl ran with
    the behaviour a newly added setting defaults to. Component tables naming another entry
    than ``cfg`` are left alone (they differ anyway)."""
    out = copy.deepcopy(saved)
    tables = {None: cfg.run, "train": cfg.train, "privacy": cfg.privacy, "system": cfg.system, "dp": cfg.dp,
              "attack": cfg.attack, "secure_aggregation": cfg.secure_aggregation,
              **{kind: getattr(cfg, kind).params for kind in COMPONENTS}}
    for key, obj in tables.items():
        table = out if key is None else out.get(key)
        if obj is None or not dataclasses.is_dataclass(obj) or not isinstance(table, dict):
            continue
        if key in COMPONENTS and table.get("name") != getattr(cfg, key).name:
            continue
        for f in dataclasses.fields(obj):
            if f.name in table or not f.init:
                continue
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            if default is not None:
                table[f.name] = tomllib.loads(tomli_w.dumps({"v": default}))["v"]
    return out
