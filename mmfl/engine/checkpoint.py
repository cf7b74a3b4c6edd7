"""Round checkpoints that resume can trust.

A checkpoint is a folder ``checkpoints/round_NNNNN`` holding ``server.safetensors``,
``clients.safetensors`` and ``meta.json``. It is written under a temporary
name, every file and the folder fsynced, and renamed into place only when
complete, then ``checkpoints/LATEST`` is replaced atomically; a crash mid-write
leaves at most a ``*.tmp`` folder that nothing reads.

``meta.json`` records the sha256 of each tensor file (``"sha256"``) and its own digest
(``"meta_sha256"``: the sha256 of its other fields as canonical JSON, the round included), so
the chain ``LATEST`` -> ``meta.json`` -> every file is checked: :func:`damage` finds a flipped
byte, a truncated or missing file, and any field of ``meta.json`` edited, added or removed
(its round, a checksum, the digest itself) before anything is loaded. A checkpoint without
the digest is damaged in a run folder this mmfl created (its ``.mmfl-run`` marker,
:mod:`mmfl.engine.runfiles`); in an unmarked folder (a run of an older mmfl) it is the old
format: it resumes, and :func:`legacy` lets the runner say so in one warning line.
:func:`resume_point` picks the newest checkpoint that passes and names the newer ones that do
not (the runner falls back to it).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from mmfl.engine import pieces, runfiles, runfolder
from mmfl.engine.state_store import LazyTensors
from mmfl.errors import MMFLError

FILES = ("server.safetensors", "clients.safetensors")
PIECE_FILES = ("server.safetensors", pieces.INDEX)  # the memory store's client state as pieces
SUMS = "sha256"  # meta.json key: {file name: hex digest}
META_SUM = "meta_sha256"  # meta.json key: the digest of its other fields (meta_digest)


def meta_digest(meta: dict) -> str:
    """sha256 of ``meta`` (without :data:`META_SUM`) as canonical JSON: sorted keys, no spaces."""
    body = {k: v for k, v in meta.items() if k != META_SUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def legacy(path: Path) -> bool:
    """Whether the checkpoint ``path`` is of the format before :data:`META_SUM` (no digest)."""
    try:
        meta = json.loads((Path(path) / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and META_SUM not in meta


def _fsync(path: Path) -> None:
    """fsync a file or a folder (a folder: so that a rename or a new entry in it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _check_complete(path: Path) -> None:
    """Raise OSError unless ``path`` is as long as its safetensors header says (safetensors'
    writer can drop a failed write, e.g. a full disk, without an error)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        try:
            header = json.loads(f.read(n)) if 0 <= n <= size else None
        except ValueError:
            header = None
    if header is None:
        raise OSError(errno.EIO, "written incompletely (disk full?)", str(path))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        raise OSError(errno.EIO, "written incompletely (disk full?)", str(path))


def _as_oserror(e: SafetensorError, path: Path) -> OSError:
    """An I/O error inside safetensors (a full disk: ``IoError(Os { code: 28, ... })``) as an OSError
    like any other write's (the runner says it in one line, mmfl.engine.runfolder.fs_error)."""
    m = re.search(r"code: (\d+)", str(e))
    code = int(m.group(1)) if m else errno.EIO
    return OSError(code, os.strerror(code), str(path))


def _save_tensors(tensors: dict[str, Tensor], path: Path) -> None:
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))  # device-independent
    except SafetensorError as e:
        raise _as_oserror(e, path) from None


def _files(sums) -> tuple[str, ...]:
    """The files a checkpoint whose meta.json records ``sums`` consists of."""
    return PIECE_FILES if isinstance(sums, dict) and pieces.INDEX in sums else FILES


def save(ckpt_root: Path, rnd: int, server: dict[str, Tensor],
         clients, meta: dict, keep: int = 1) -> Path:
    """``clients``: the client-state tensors, a function writing them to the path it is
    given, or a store: one with ``write_pieces`` (the memory store) writes its changed clients
    as pieces (:mod:`mmfl.engine.pieces`), else its ``write_checkpoint`` (a disk-backed store
    streams its changes without holding them in memory).
    On an error (a full disk) the temporary folder is removed and the older checkpoints
    are left as they were."""
    if getattr(clients, "incremental", False) and hasattr(clients, "write_pieces"):
        return _save(ckpt_root, rnd, server, None, meta, keep, clients)
    if hasattr(clients, "write_checkpoint"):
        clients = clients.write_checkpoint
    return _save(ckpt_root, rnd, server, clients, meta, keep, None)


def _save(ckpt_root: Path, rnd: int, server: dict[str, Tensor],
          clients: dict[str, Tensor] | Callable[[str], None] | None, meta: dict, keep: int, store) -> Path:
    runfiles.note(ckpt_root, owned_dir=True)  # what --overwrite may delete (mmfl.engine.runfiles)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"round_{rnd:05d}"
    tmp = ckpt_root / f"round_{rnd:05d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        _save_tensors(server, tmp / FILES[0])
        files = FILES
        if store is not None:  # only the clients saved since the last checkpoint are written
            box = pieces.Pieces(ckpt_root)
            index = store.write_pieces(box)
            box.sync()
            with open(tmp / pieces.INDEX, "w") as f:
                f.write(pieces.index_text(index))
                f.flush()
            files = PIECE_FILES
        elif callable(clients):  # the store writes its own file (the memory store: safetensors' save_file)
            try:
                clients(str(tmp / FILES[1]))
            except SafetensorError as e:
                raise _as_oserror(e, tmp / FILES[1]) from None
            except OSError as e:  # name the file the error line points at
                if e.filename is not None:
                    raise
                raise OSError(e.errno, e.strerror, str(tmp / FILES[1])) from None
        else:
            _save_tensors(clients, tmp / FILES[1])
        sums = {}
        for name in files:
            if name.endswith(".safetensors"):
                _check_complete(tmp / name)
            _fsync(tmp / name)
            sums[name] = sha256(tmp / name)
        full = {**meta, SUMS: sums}
        runfolder.atomic_write(tmp / "meta.json", json.dumps({**full, META_SUM: meta_digest(full)}))
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(ckpt_root)
    runfolder.atomic_write(ckpt_root / "LATEST", final.name)
    _fsync(ckpt_root)
    for old in sorted(ckpt_root.glob("round_?????"))[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    pieces.collect(ckpt_root)  # pieces no kept checkpoint names
    return final


def damage(path: Path) -> str | None:
    """Why the checkpoint folder ``path`` cannot be trusted, or None when it can: meta.json
    missing or unreadable, a tensor file missing, or not matching its sha256 (a checkpoint
    written before checksums: its files' safetensors headers must read)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        rnd = int(meta["round"])
        sums = meta.get(SUMS)
        digest = meta.get(META_SUM)
    except FileNotFoundError:
        return "no meta.json (incomplete)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"meta.json is unreadable ({type(e).__name__})"
    if digest is not None:
        if digest != meta_digest(meta):
            return "meta.json does not match its own digest (a field edited, added or removed)"
    elif runfiles.is_marked(path.parent.parent):  # a run this mmfl created writes the digest
        return f"meta.json has no {META_SUM} (its digest removed)"
    files = _files(sums)
    if digest is not None and (not isinstance(sums, dict) or any(name not in sums for name in files)):
        lacking = [n for n in files if not isinstance(sums, dict) or n not in sums]
        return f"meta.json lacks the sha256 of {', '.join(lacking)}"
    if sums is not None and not isinstance(sums, dict):
        return "meta.json is unreadable (sha256 is not a table)"
    m = re.fullmatch(r"round_(\d{5})", path.name)
    if m and int(m.group(1)) != rnd:
        return f"meta.json's round ({rnd}) is not its folder's ({path.name})"
    for name in files:
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        try:
            if sums is None:
                with safe_open(str(p), framework="pt"):
                    pass
            elif sha256(p) != sums.get(name):
                return f"{name} does not match its sha256 in meta.json"
        except (OSError, SafetensorError) as e:
            return f"{name} is unreadable ({e})"
    return pieces.damage(path) if files is PIECE_FILES else None


def resume_point(ckpt_root: Path) -> tuple[Path | None, list[str]]:
    """The newest intact checkpoint and one ``"round_NNNNN: why"`` per newer damaged one.
    ``(None, [])``: no checkpoint at all. Raises MMFLError when there are checkpoints but
    none is intact (``keep_checkpoints = 1`` keeps no older one to fall back to)."""
    if not ckpt_root.is_dir():
        return None, []
    damaged = []
    for path in sorted((p for p in ckpt_root.glob("round_?????") if p.is_dir()), reverse=True):
        why = damage(path)
        if why is None:
            return path, damaged
        damaged.append(f"{path.name}: {why}")
    if damaged or (ckpt_root / "LATEST").is_file():
        what = "; ".join(damaged) or "LATEST names a folder that is missing"
        raise MMFLError(f"{ckpt_root}: checkpoint is unreadable and no older intact one is left ({what}); "
                        "keep_checkpoints >= 2 keeps one to fall back to; start over with --overwrite")
    return None, []


def latest(ckpt_root: Path) -> Path | None:
    """The newest intact checkpoint (None: none written yet); see :func:`resume_point`."""
    return resume_point(ckpt_root)[0]


def load(path: Path, lazy_clients: bool = False,
         verify: bool = True) -> tuple[dict[str, Tensor], Mapping[str, Tensor], dict]:
    """``lazy_clients``: the client part as a mapping that reads one tensor per access.
    ``verify``: check the files against their checksums first (:func:`damage`)."""
    why = damage(path) if verify else None
    if why is not None:
        raise MMFLError(f"{path}: checkpoint is unreadable ({why})")
    try:
        meta = json.loads((path / "meta.json").read_text())
        server = load_file(str(path / FILES[0]))
        if (path / pieces.INDEX).is_file() and _files(meta.get(SUMS)) is PIECE_FILES:
            clients = pieces.PieceTensors(path)
            clients = clients if lazy_clients else dict(clients)
        else:
            cpath = str(path / FILES[1])
            clients = LazyTensors(cpath) if lazy_clients else load_file(cpath)
    except (OSError, ValueError, SafetensorError) as e:
        raise MMFLError(f"{path}: checkpoint is unreadable ({e})") from None
    meta.pop(SUMS, None), meta.pop(META_SUM, None)
    return server, clients, meta
