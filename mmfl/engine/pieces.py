"""Client state in checkpoints as content-addressed pieces: a checkpoint writes only the clients
that changed since the last one.

The memory store (:class:`mmfl.engine.state_store.ClientStateStore`) serializes each client's state
as one safetensors blob, a *piece*, stored once under ``checkpoints/pieces/<sha256>.safetensors``
(its name is the sha256 of its bytes). A checkpoint's ``clients.json`` (:data:`INDEX`) maps each
client id to its piece; the store remembers which piece holds each client's state and writes a
new one only for a client saved since (:meth:`Pieces.put`). So the bytes a checkpoint writes
are the round's work (its cohort's states + the server + an index of ~80 bytes a client), not
every client ever seen.

The chain of trust is unbroken: ``LATEST`` -> ``meta.json`` (its own digest) -> ``clients.json``
(its sha256 in ``meta.json``) -> each piece (its sha256 is its name): :func:`damage` finds a piece
missing, truncated or altered. A piece is written to ``<name>.tmp``, fsynced and renamed before the
checkpoint folder naming it is renamed into place, so a crash never leaves a checkpoint with a
half-written piece. :func:`collect` removes the pieces no kept checkpoint's index names (after
the old checkpoints are removed); a kept checkpoint whose index cannot be read keeps every piece.
``pieces/`` lies inside ``checkpoints/``, the folder the run records owning whole
(:mod:`mmfl.engine.runfiles`); only file names of the pieces' own form are ever deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

DIR = "pieces"  # under checkpoints/
INDEX = "clients.json"  # in a checkpoint folder: {"pieces": {cid: sha256}}
_NAME = re.compile(r"[0-9a-f]{64}\.safetensors(\.tmp)?")


class Pieces:
    """The pieces folder ``ckpt_root/pieces`` of one run: what a store writes its changed clients to."""

    def __init__(self, ckpt_root: Path):
        self.dir = Path(ckpt_root) / DIR
        self.written = 0  # bytes written by put() (benchmarks)

    def path(self, digest: str) -> Path:
        return self.dir / f"{digest}.safetensors"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put(self, data: bytes) -> str:
        """Store ``data`` (fsynced, renamed into place); its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.path(digest)
        tmp = final.with_name(final.name + ".tmp")
        try:
            _write(tmp, data)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OSError(e.errno, e.strerror, str(final)) from None
        os.replace(tmp, final)
        self.written += len(data)
        return digest

    def sync(self) -> None:
        """fsync the folder (its new entries durable before a checkpoint names them)."""
        if self.dir.is_dir():
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_index(ckpt: Path) -> dict[int, str]:
    """A checkpoint's ``{cid: piece sha256}``; raises ValueError/OSError when unreadable."""
    raw = json.loads((Path(ckpt) / INDEX).read_text())
    pieces = raw.get("pieces") if isinstance(raw, dict) else None
    if not isinstance(pieces, dict):
        raise ValueError("no 'pieces' table")
    out = {}
    for cid, digest in pieces.items():
        if not (cid.lstrip("-").isdigit() and isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            raise ValueError(f"bad entry {cid!r}")
        out[int(cid)] = digest
    return out


def index_text(index: Mapping[int, str]) -> str:
    return json.dumps({"pieces": {str(c): index[c] for c in sorted(index)}}, separators=(",", ":"))


def damage(ckpt: Path) -> str | None:
    """Why a checkpoint's pieces cannot be trusted (its ``clients.json`` itself already checked
    against ``meta.json``), or None."""
    try:
        index = read_index(ckpt)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{INDEX} is unreadable ({type(e).__name__})"
    pieces = Pieces(Path(ckpt).parent)
    for cid, digest in sorted(index.items()):
        p = pieces.path(digest)
        if not p.is_file():
            return f"{DIR}/{p.name} (client {cid}) is missing"
        try:
            if _sha256(p) != digest:
                return f"{DIR}/{p.name} (client {cid}) does not match its sha256"
        except OSError as e:
            return f"{DIR}/{p.name} (client {cid}) is unreadable ({e})"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


class PieceTensors(Mapping):
    """A checkpoint's client state as a flat ``"{cid}/{name}" -> tensor`` mapping, read one piece
    at a time; ``.pieces`` is its index (the store keeps it: unchanged clients are not rewritten)."""

    def __init__(self, ckpt: Path):
        self.pieces = read_index(ckpt)
        self._store = Pieces(Path(ckpt).parent)
        self._keys: dict[str, tuple[int, str]] = {}
        from safetensors import safe_open

        for cid in sorted(self.pieces):
            with safe_open(str(self._store.path(self.pieces[cid])), framework="pt") as f:
                for name in f.keys():
                    self._keys[f"{cid}/{name}"] = (cid, name)
        self._cache: tuple[int, dict[str, Tensor]] | None = None

    def __getitem__(self, key: str) -> Tensor:
        cid, name = self._keys[key]
        if self._cache is None or self._cache[0] != cid:
            from safetensors.torch import load_file

            self._cache = (cid, load_file(str(self._store.path(self.pieces[cid]))))
        return self._cache[1][name]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def collect(ckpt_root: Path) -> int:
    """Remove the pieces (and leftover ``.tmp`` pieces) that no checkpoint folder's index names;
    nothing when some checkpoint's index is unreadable. The number of files removed."""
    folder = Path(ckpt_root) / DIR
    if not folder.is_dir():
        return 0
    keep: set[str] = set()
    for ckpt in Path(ckpt_root).glob("round_?????"):
        if not (ckpt / INDEX).exists():
            continue
        try:
            keep.update(f"{d}.safetensors" for d in read_index(ckpt).values())
        except (OSError, ValueError, KeyError, TypeError):
            return 0
    removed = 0
    for p in folder.iterdir():
        if _NAME.fullmatch(p.name) and p.name not in keep:
            p.unlink(missing_ok=True)
            removed += 1
    return removed
