"""What a run folder's ``--overwrite`` may delete: only what mmfl recorded writing there.

- ``.mmfl-run`` (:data:`MARKER`): written when mmfl creates a run folder (a new run, or one
  replaced by ``--overwrite``): ``{"run_id", "mmfl", "created"}``. A folder without it is not
  a run of this mmfl (a user's folder, or a run written by an mmfl from before the marker):
  ``--overwrite`` refuses it with one line and deletes nothing.
- ``.mmfl-files`` (:data:`LISTING`): every path the run wrote, relative to the folder, one a
  line, appended *before* the file is written (a crash leaves a listed path that may be
  absent, never an unlisted mmfl file). A line ending in ``/`` is a folder mmfl owns whole
  (``checkpoints/``, ``client_state/``, the trackers' folders, ``reference/``, Flower's
  ``node_state/``). ``X.tmp`` beside a listed ``X`` is mmfl's half-written copy of it.

:func:`check_overwrite` refuses (one line naming the first file mmfl did not list) before
anything is deleted; :func:`clear` then deletes the listed files, the owned folders and the
folders that held them once empty. Writers record through :func:`record` (a run folder and
names) or :func:`note` (a path: the nearest run folder above it, if any).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import uuid
from pathlib import Path

from mmfl._version import __version__
from mmfl.errors import MMFLError

MARKER = ".mmfl-run"
LISTING = ".mmfl-files"
LOCK = ".lock"
OWN = (LOCK, MARKER, LISTING)  # the folder's own bookkeeping
_listed: dict[str, set[str]] = {}  # resolved run folder -> its listing (read once per process)


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def start(run_dir: Path) -> str:
    """Mark ``run_dir`` (created, empty but for its lock) as a new mmfl run; its run id."""
    run_dir = Path(run_dir)
    run_id = uuid.uuid4().hex
    (run_dir / LISTING).write_text("")
    meta = {"run_id": run_id, "mmfl": __version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    tmp = run_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(meta) + "\n")
    os.replace(tmp, run_dir / MARKER)
    _listed[_key(run_dir)] = set()
    return run_id


def is_marked(run_dir: Path) -> bool:
    return (Path(run_dir) / MARKER).is_file()


def run_id(run_dir: Path) -> str | None:
    """The run id in the folder's marker (None: no marker, or unreadable)."""
    try:
        return json.loads((Path(run_dir) / MARKER).read_text())["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def listed(run_dir: Path) -> set[str]:
    """The folder's listing (empty without one)."""
    key = _key(run_dir)
    if key not in _listed:
        try:
            text = (Path(run_dir) / LISTING).read_text(errors="replace")
        except OSError:
            text = ""
        _listed[key] = {line for line in text.splitlines() if line}
    return _listed[key]


def record(run_dir: Path, *names: str) -> None:
    """Add ``names`` (paths relative to ``run_dir``; ``"dir/"``: a folder mmfl owns whole) to the
    listing, before they are written. Nothing happens in a folder without the marker (a run of an
    older mmfl being resumed: it stays unmarked, so ``--overwrite`` still refuses it)."""
    run_dir = Path(run_dir)
    if not is_marked(run_dir):
        return
    have = listed(run_dir)
    new = [n for n in names if n not in have and not _owned(n, have)]
    if not new:
        return
    with open(run_dir / LISTING, "a") as f:
        f.write("".join(n + "\n" for n in new))
    have.update(new)


def note(path: Path, owned_dir: bool = False, depth: int = 4) -> None:
    """Record ``path`` in the nearest run folder above it (within ``depth`` levels), if any."""
    path = Path(path).absolute()
    for parent in list(path.parents)[:depth]:
        if (parent / MARKER).is_file():
            rel = path.relative_to(parent).as_posix()
            record(parent, rel + "/" if owned_dir else rel)
            return


def _owned(rel: str, have: set[str]) -> bool:
    """Whether ``rel`` lies in a folder the listing owns whole."""
    parts = rel.rstrip("/").split("/")
    return any("/".join(parts[:i]) + "/" in have for i in range(1, len(parts)))


def _allowed(rel: str, have: set[str]) -> bool:
    if rel in OWN or rel in have or _owned(rel, have):
        return True
    return rel.endswith(".tmp") and rel[:-4] in have  # mmfl's half-written copy of a listed file


def first_unlisted(run_dir: Path) -> str | None:
    """The first path (sorted walk) in ``run_dir`` that the listing does not cover, or None."""
    run_dir = Path(run_dir)
    have = listed(run_dir)
    parents = {"/".join(p.split("/")[:i]) for p in have for i in range(1, p.rstrip("/").count("/") + 1)}
    for top, dirs, files in os.walk(run_dir):
        rel_top = Path(top).relative_to(run_dir).as_posix()
        pre = "" if rel_top == "." else rel_top + "/"
        dirs.sort()
        for name in sorted(files):
            if not _allowed(pre + name, have):
                return pre + name
        keep = []
        for d in dirs:  # an owned folder is not walked; another one must lead to listed files
            rel = pre + d
            if rel + "/" in have or _owned(rel + "/", have):
                continue
            if os.path.islink(os.path.join(top, d)):
                if not _allowed(rel, have):
                    return rel
                continue
            if rel not in parents:
                return rel + "/"
            keep.append(d)
        dirs[:] = keep
    return None


def check_overwrite(run_dir: Path) -> None:
    """MMFLError (one line) unless every file in the folder is one mmfl recorded writing."""
    run_dir = Path(run_dir)
    if not is_marked(run_dir):
        raise MMFLError(f"{run_dir}: not a run folder of this mmfl (no {MARKER} marker: a folder of yours, or a "
                        "run written by an mmfl from before the marker); --overwrite deletes only files a run "
                        "recorded writing: move the folder away or delete it by hand, or use --set name=<new name>")
    stray = first_unlisted(run_dir)
    if stray is not None:
        raise MMFLError(f"{run_dir}: {stray} was not written by this run (not in {LISTING}); --overwrite deletes "
                        "only what mmfl wrote and deleted nothing: move it out of the folder, or use "
                        "--set name=<new name>")


def clear(run_dir: Path) -> None:
    """Delete what the listing names (after :func:`check_overwrite`), its lock file kept."""
    run_dir = Path(run_dir)
    have = sorted(listed(run_dir), key=lambda p: -p.count("/"))
    for rel in have:
        p = run_dir / rel.rstrip("/")
        if rel.endswith("/") and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            for q in (p, p.with_name(p.name + ".tmp")):
                if q.is_symlink() or q.is_file():
                    q.unlink()
    for rel in have:  # the folders that held listed files, deepest first, once empty
        parts = rel.rstrip("/").split("/")[:-1]
        while parts:
            d = run_dir.joinpath(*parts)
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
            parts.pop()
    for name in (MARKER, LISTING):
        (run_dir / name).unlink(missing_ok=True)
    _listed.pop(_key(run_dir), None)
