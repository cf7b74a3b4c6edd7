"""What a run folder's ``--overwrite`` may delete: only what mmfl recorded writing there.

- ``.mmfl-run`` (:data:`MARKER`): written when mmfl creates a run folder (a new run, or one
  replaced by ``--overwrite``): ``{"run_id", "mmfl", "created"}``. A folder without it is not
  a run of this mmfl (a user's folder, or a run written by an mmfl from before the marker):
  ``--overwrite`` refuses it with one line and deletes nothing.
- ``.mmfl-files`` (:data:`LISTING`): every path the run wrote, relative to the folder, one a
  line, appended *before* the file is written (a crash leaves a listed path that may be
  absent). A line ending in ``/`` is a folder mmfl created and writes into (``checkpoints/``,
  ``client_state/``, the trackers' folders, ``reference/``, Flower's ``node_state/``). A folder
  is not a licence for its contents: the files in it are listed one by one too, by
  :func:`seal` (a walk of the listed folders, appending what is there), which runs whenever
  mmfl records a write (:func:`note`: every ``atomic_write`` of the run folder, the checkpoint's
  ``LATEST``, the trackers' ``tracking.json`` after each round and at their close). A file a
  user puts into such a folder *while the run is running* is therefore taken as the run's; one
  put there afterwards is not. ``X.tmp`` beside a listed ``X`` is mmfl's half-written copy of it.

:func:`check_overwrite` refuses (one line naming the first file or folder mmfl did not list,
at any depth) before anything is deleted; :func:`clear` then deletes the listed files only,
and the listed folders and the folders that held listed files only once they are empty.
Writers record through :func:`record` (a run folder and names) or :func:`note` (a path: the
nearest run folder above it, if any).
"""

from __future__ import annotations

import datetime
import json
import os
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
    new = list(dict.fromkeys(n for n in names if n not in have))
    if not new:
        return
    with open(run_dir / LISTING, "a") as f:
        f.write("".join(n + "\n" for n in new))
    have.update(new)


def note(path: Path, owned_dir: bool = False, depth: int = 4) -> None:
    """Record ``path`` in the nearest run folder above it (within ``depth`` levels), if any, and
    :func:`seal` that folder (what mmfl's folders hold by now is the run's)."""
    path = Path(path).absolute()
    for parent in list(path.parents)[:depth]:
        if (parent / MARKER).is_file():
            rel = path.relative_to(parent).as_posix()
            record(parent, rel + "/" if owned_dir else rel)
            seal(parent)
            return


def seal(run_dir: Path) -> None:
    """List every file and folder now inside the folders the listing names (``dir/``), one by
    one: what mmfl and the libraries it drives (checkpoints, client state, TensorBoard, MLflow)
    wrote there so far. Nothing happens in an unmarked folder."""
    run_dir = Path(run_dir)
    if not is_marked(run_dir):
        return
    have = listed(run_dir)
    found = []
    for rel in sorted(p for p in have if p.endswith("/")):
        top = run_dir / rel
        if top.is_symlink() or not top.is_dir():
            continue
        for root, dirs, files in os.walk(top):
            pre = Path(root).relative_to(run_dir).as_posix() + "/"
            dirs.sort()
            found += [pre + d + ("" if os.path.islink(os.path.join(root, d)) else "/") for d in dirs]
            found += [pre + f for f in sorted(files)]
    found = [f for f in found if f not in have]
    if found:
        record(run_dir, *found)


def _allowed(rel: str, have: set[str]) -> bool:
    if rel in OWN or rel in have:
        return True
    return rel.endswith(".tmp") and rel[:-4] in have  # mmfl's half-written copy of a listed file


def _tmp_dir(rel: str, have: set[str], parents: set[str]) -> bool:
    """``X.tmp``: mmfl's half-written copy of folder ``X`` (a crash inside a checkpoint's save), in
    a folder mmfl wrote; its files must still be listed."""
    if not rel.endswith(".tmp"):
        return False
    up = rel.rpartition("/")[0]
    return rel[:-4] + "/" in have or rel[:-4] in parents or (up != "" and (up + "/" in have or up in parents))


def first_unlisted(run_dir: Path) -> str | None:
    """The first path (sorted walk) in ``run_dir`` that the listing does not cover, or None."""
    run_dir = Path(run_dir)
    have = listed(run_dir)
    parents = {"/".join(p.split("/")[:i]) for p in have for i in range(1, p.rstrip("/").count("/") + 1)}
    for top, dirs, files in os.walk(run_dir):  # every folder, mmfl's own included: its files are listed too
        rel_top = Path(top).relative_to(run_dir).as_posix()
        pre = "" if rel_top == "." else rel_top + "/"
        dirs.sort()
        for name in sorted(files):
            if not _allowed(pre + name, have):
                return pre + name
        keep = []
        for d in dirs:  # a folder must be listed, or lead to listed paths
            rel = pre + d
            if os.path.islink(os.path.join(top, d)):  # a link is a file here: listed, or refused
                if not _allowed(rel, have):
                    return rel
                continue
            if rel + "/" not in have and rel not in parents and not _tmp_dir(rel, have, parents):
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
    """Delete the files the listing names (after :func:`check_overwrite`), then the listed
    folders and those that held listed files, deepest first, each only once empty; the lock
    file is kept. Nothing unlisted is deleted, at any depth (a file that appeared after the
    check stays, and so does its folder)."""
    run_dir = Path(run_dir)
    have = listed(run_dir)
    folders = set()
    for rel in have:
        parts = rel.rstrip("/").split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        p = run_dir / rel.rstrip("/")
        if rel.endswith("/") and not p.is_symlink():
            folders.add(rel.rstrip("/"))
            continue
        for q in (p, p.with_name(p.name + ".tmp")):
            if q.is_symlink() or q.is_file():
                q.unlink()
    parents = folders.copy()
    for top, dirs, _ in os.walk(run_dir, topdown=False):  # deepest first, each only once empty
        for d in dirs:
            path = os.path.join(top, d)
            rel = Path(path).relative_to(run_dir).as_posix()
            if (rel in folders or _tmp_dir(rel, have, parents)) and not os.path.islink(path) and not os.listdir(path):
                os.rmdir(path)
    for name in (MARKER, LISTING):
        (run_dir / name).unlink(missing_ok=True)
    _listed.pop(_key(run_dir), None)
