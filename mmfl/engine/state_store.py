"""The engine-owned store of per-client state between rounds.

Client code never keeps objects alive between messages (on Flower a client is
rebuilt for every message); what must persist (MOON's previous model,
SCAFFOLD's control variate, a SOLO client's model) is a dict of tensors the
engine loads before and saves after each message.

Two stores share one interface (``load``/``save``/``state_dict``/
``load_state_dict`` plus ``write_checkpoint``/``commit`` for the round loop):

- :class:`ClientStateStore` keeps every client's state in memory; a checkpoint
  writes the clients saved since the last one as content-addressed pieces and
  names the others' unchanged pieces (:mod:`mmfl.engine.pieces`).
- :class:`DiskClientStateStore` keeps only the current round's changes in a
  journal and the rest in one file per state key with a row per client, read
  and written with ``pread``/``pwrite`` (page cache, not process memory), so
  10,000 clients' MOON models cost disk, not RAM. Its checkpoint holds the
  round's changes only, streamed from the journal.

``RunConfig.state_store`` picks one (:func:`make_store`; ``auto`` = disk from
:data:`AUTO_DISK_CLIENTS` clients on).

Checkpoint protocol (the runner): after a checkpointed round (every
``checkpoint_every`` rounds and the last), ``write_checkpoint(path)`` writes the
store's part of the checkpoint; once that checkpoint is in place, ``commit()``.
Between checkpoints the disk store's journal holds every round's changes since
the last commit (a client saved again reuses its slot), so the checkpoint holds
all changes since the previous one. On resume, ``load_state_dict(checkpoint's
clients part)``. For the disk store, the committed files are never ahead of the
latest checkpoint and at most one checkpoint behind it, and replaying that
checkpoint's changes (full rows, idempotent) brings them exactly to it; an
uncommitted journal is discarded on open. So a crash anywhere resumes exactly.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmfl.core.device import to_device
from mmfl.core.state import load_field, per_client, split_client_key

AUTO_DISK_CLIENTS = 1000  # state_store = "auto": disk from this many clients on
DELETED = ".deleted"  # checkpoint key "{cid}/.deleted": the client's state was cleared

# torch dtype <-> safetensors dtype code
_ST = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
       torch.bool: "BOOL"}
_DT = {str(k).removeprefix("torch."): k for k in _ST}


CLIENTS = per_client()  # the store's declared state: cid -> {name: tensor}


class ClientStateStore:
    """In-memory store: ``cid -> {name: tensor}``; flattens for checkpoints (a :func:`per_client` field).

    ``device``: the run's device. States are kept where the clients left them (on the device:
    no copy per round) and written to checkpoints from the CPU; a state restored from a
    checkpoint (CPU tensors) is moved onto the device when a client loads it."""

    incremental = True  # checkpoints as pieces (False: the whole store in one file, the format before)

    def __init__(self, device: torch.device | None = None):
        self._states: dict[int, dict[str, Tensor]] = {}
        self._pieces: dict[int, str] = {}  # cid -> sha256 of the piece holding its current state
        self.device = device

    def load(self, cid: int) -> dict[str, Tensor]:
        state = dict(self._states.get(cid, {}))
        return state if self.device is None else to_device(state, self.device)

    def save(self, cid: int, state: dict[str, Tensor]) -> None:
        self._pieces.pop(cid, None)  # changed: the next checkpoint writes its piece
        if state:
            self._states[cid] = {k: v.detach() for k, v in state.items()}
        else:
            self._states.pop(cid, None)

    def __len__(self) -> int:
        return len(self._states)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self._states.values() for t in s.values())

    def state_dict(self) -> dict[str, Tensor]:
        """Flat ``"{cid}/{name}" -> tensor`` on the CPU (for safetensors)."""
        return {k: t.cpu().contiguous() for k, t in CLIENTS.flatten(self._states).items()}

    def load_state_dict(self, flat: Mapping[str, Tensor]) -> None:
        """``flat``: a checkpoint's client part; pieces (mmfl.engine.pieces.PieceTensors) are
        remembered, so clients that do not change are not written again."""
        self._states = load_field(CLIENTS, flat, owner="client state")
        self._pieces = {c: d for c, d in getattr(flat, "pieces", {}).items() if c in self._states}

    # --- the round loop's checkpoint protocol
    def write_pieces(self, box) -> dict[int, str]:
        """Write a piece (``box.put``, mmfl.engine.pieces.Pieces) for each client saved since the
        last checkpoint (or whose piece is gone); ``{cid: sha256}`` of every client's piece."""
        from safetensors.torch import save

        for cid in sorted(self._states):
            if cid not in self._pieces or not box.has(self._pieces[cid]):
                state = {k: t.cpu().contiguous() for k, t in self._states[cid].items()}
                self._pieces[cid] = box.put(save(state))
        return {cid: self._pieces[cid] for cid in sorted(self._states)}

    def write_checkpoint(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        save_file(self.state_dict(), str(path))

    def commit(self) -> None:
        """Nothing to do: every checkpoint holds the whole store."""


def _tensor_bytes(t: Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, shape, dtype: torch.dtype) -> Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype, device="cpu")
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class DiskClientStateStore:
    """Client state in files under ``root`` (created on first use).

    Layout: ``manifest.json`` lists the state keys (name, shape, dtype, file);
    ``kNNNNN.bin`` holds one key's rows, row ``cid`` at byte ``cid * row_bytes``
    (sparse: clients without state cost no disk); ``presence.npz`` says which
    rows are set; ``journal.bin`` holds this round's saves until :meth:`commit`.
    A key name seen with two shapes gets two entries (one set per client).
    Memory: the manifest, one presence bit per (key, client) and the journal's
    index, never the states themselves.
    """

    def __init__(self, root: str | Path, device: torch.device | None = None):
        self.root = Path(root)
        self._open = False
        self.device = device  # where load() puts a client's state (None: the CPU, as read)

    # --- files
    def _ensure_open(self) -> None:
        if self._open:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        man = self.root / "manifest.json"
        self._entries: list[dict] = json.loads(man.read_text())["entries"] if man.is_file() else []
        pres = self.root / "presence.npz"
        self._present: list[np.ndarray] = []
        if pres.is_file():
            with np.load(pres) as z:
                self._present = [z[f"e{i}"].copy() for i in range(len(self._entries))]
        self._present += [np.zeros(0, dtype=bool) for _ in range(len(self._entries) - len(self._present))]
        self._fds: dict[int, int] = {}
        self._journal = os.open(self.root / "journal.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._jsize = 0
        self._index: dict[int, dict[str, tuple[int, tuple, torch.dtype]] | None] = {}
        self._open = True

    def _fd(self, e: int) -> int:
        if e not in self._fds:
            self._fds[e] = os.open(self.root / self._entries[e]["file"], os.O_RDWR | os.O_CREAT, 0o644)
        return self._fds[e]

    def _entry(self, name: str, shape: tuple, dtype: torch.dtype, create: bool = True) -> int:
        dt = str(dtype).removeprefix("torch.")
        for i, e in enumerate(self._entries):
            if e["name"] == name and tuple(e["shape"]) == tuple(shape) and e["dtype"] == dt:
                return i
        if not create:
            return -1
        row = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self._entries.append({"name": name, "shape": list(shape), "dtype": dt, "row_bytes": row,
                              "file": f"k{len(self._entries):05d}.bin"})
        self._present.append(np.zeros(0, dtype=bool))
        return len(self._entries) - 1

    def _is_set(self, e: int, cid: int) -> bool:
        p = self._present[e]
        return cid < p.shape[0] and bool(p[cid])

    def _set(self, e: int, cid: int, value: bool) -> None:
        p = self._present[e]
        if cid >= p.shape[0]:
            if not value:
                return
            grown = np.zeros(max(cid + 1, 2 * p.shape[0], 1024), dtype=bool)
            grown[:p.shape[0]] = p
            self._present[e] = p = grown
        p[cid] = value

    def _write_row(self, cid: int, name: str, shape: tuple, dtype: torch.dtype, data: bytes) -> int:
        e = self._entry(name, shape, dtype)
        os.pwrite(self._fd(e), data, cid * self._entries[e]["row_bytes"])
        self._set(e, cid, True)
        return e

    def _clear_except(self, cid: int, keep: set[int]) -> None:
        for e in range(len(self._entries)):
            if e not in keep:
                self._set(e, cid, False)

    def _persist(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)
        np.savez(self.root / "presence.tmp.npz", **{f"e{i}": p for i, p in enumerate(self._present)})
        os.replace(self.root / "presence.tmp.npz", self.root / "presence.npz")
        tmp = self.root / "manifest.json.tmp"
        tmp.write_text(json.dumps({"entries": self._entries}))
        os.replace(tmp, self.root / "manifest.json")

    # --- the interface
    def load(self, cid: int) -> dict[str, Tensor]:
        state = self._read(cid)
        return state if self.device is None else to_device(state, self.device)

    def _read(self, cid: int) -> dict[str, Tensor]:
        self._ensure_open()
        if cid in self._index:
            rows = self._index[cid]
            return {} if rows is None else {
                n: _from_bytes(os.pread(self._journal, _nbytes(s, d), off), s, d) for n, (off, s, d) in rows.items()}
        out = {}
        for e, ent in enumerate(self._entries):
            if self._is_set(e, cid):
                data = os.pread(self._fd(e), ent["row_bytes"], cid * ent["row_bytes"])
                out[ent["name"]] = _from_bytes(data, tuple(ent["shape"]), _DT[ent["dtype"]])
        return out

    def save(self, cid: int, state: dict[str, Tensor]) -> None:
        self._ensure_open()
        if not state:
            self._index[cid] = None
            return
        rows, before = {}, self._index.get(cid) or {}
        for name, t in state.items():
            data = _tensor_bytes(t)
            old = before.get(name)  # saved again before a commit (checkpoint_every > 1): same slot
            off = old[0] if old is not None and _nbytes(old[1], old[2]) == len(data) else self._jsize
            os.pwrite(self._journal, data, off)
            rows[name] = (off, tuple(t.shape), t.dtype)
            if off == self._jsize:
                self._jsize += len(data)
        self._index[cid] = rows

    def clients(self) -> list[int]:
        """Ids of the clients holding state."""
        self._ensure_open()
        ids = set()
        for p in self._present:
            ids.update(np.flatnonzero(p).tolist())
        for cid, rows in self._index.items():
            (ids.discard if rows is None else ids.add)(cid)
        return sorted(ids)

    def __len__(self) -> int:
        return len(self.clients())

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for cid in self.clients() for t in self._read(cid).values())

    def state_dict(self) -> dict[str, Tensor]:
        """Every client's state, flat (materializes the store: for tests and small runs)."""
        return {f"{cid}/{k}": t for cid in self.clients() for k, t in self._read(cid).items()}

    def load_state_dict(self, flat: Mapping[str, Tensor]) -> None:
        """Apply a checkpoint's changes (``"{cid}/{name}"`` rows, ``"{cid}/.deleted"``) to the
        files, one tensor at a time; each listed client's state is replaced whole."""
        self._ensure_open()
        self._index.clear()
        by_cid: dict[int, list[str]] = {}
        for key in flat.keys():
            cid, name = split_client_key(key)
            by_cid.setdefault(cid, []).append(name)
        for cid, names in by_cid.items():
            keep = set()
            for name in names:
                if name == DELETED:
                    continue
                t = flat[f"{cid}/{name}"]
                keep.add(self._write_row(cid, name, tuple(t.shape), t.dtype, _tensor_bytes(t)))
            self._clear_except(cid, keep)
        self._persist()

    def write_checkpoint(self, path: str | Path) -> None:
        """This round's changes as a safetensors file, streamed from the journal."""
        self._ensure_open()
        header, chunks, at = {}, [], 0
        for cid in sorted(self._index):
            rows = self._index[cid]
            if rows is None:
                header[f"{cid}/{DELETED}"] = {"dtype": "U8", "shape": [0], "data_offsets": [at, at]}
                continue
            for name, (off, shape, dtype) in rows.items():
                n = _nbytes(shape, dtype)
                header[f"{cid}/{name}"] = {"dtype": _ST[dtype], "shape": list(shape), "data_offsets": [at, at + n]}
                chunks.append((off, n))
                at += n
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for off, n in chunks:
                done = 0
                while done < n:
                    piece = os.pread(self._journal, min(n - done, 1 << 24), off + done)
                    f.write(piece)
                    done += len(piece)
            f.flush()
            os.fsync(f.fileno())

    def commit(self) -> None:
        """Move the journal into the per-key files (after the checkpoint holding it is in place)."""
        self._ensure_open()
        for cid, rows in self._index.items():
            keep = set()
            for name, (off, shape, dtype) in (rows or {}).items():
                keep.add(self._write_row(cid, name, shape, dtype, os.pread(self._journal, _nbytes(shape, dtype), off)))
            self._clear_except(cid, keep)
        self._persist()
        os.ftruncate(self._journal, 0)
        self._jsize = 0
        self._index.clear()

    def close(self) -> None:
        if self._open:
            for fd in [*self._fds.values(), self._journal]:
                os.close(fd)
            self._open = False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _nbytes(shape, dtype: torch.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def make_store(kind: str, num_clients: int, root: str | Path, device: torch.device | None = None):
    """The store ``RunConfig.state_store`` asks for (``root``: the disk store's folder; ``device``:
    where clients get their state, None or the CPU: as stored)."""
    if kind == "auto":
        kind = "disk" if num_clients >= AUTO_DISK_CLIENTS else "memory"
    if device is not None and device.type == "cpu":
        device = None
    return DiskClientStateStore(root, device) if kind == "disk" else ClientStateStore(device)


class LazyTensors(Mapping):
    """A safetensors file as a read-only mapping that loads one tensor per access."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self._f = safe_open(str(path), framework="pt")
        self._keys = list(self._f.keys())
        self._known = set(self._keys)

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._known:
            raise KeyError(key)
        return self._f.get_tensor(key).clone()

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
