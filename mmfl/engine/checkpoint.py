"""Round checkpoints that resume can trust.

A checkpoint is a folder ``checkpoints/round_NNNNN`` holding ``server.safetensors``,
``clients.safetensors`` and ``meta.json``. It is written under a temporary
name and renamed into place only when complete, then ``checkpoints/LATEST``
is replaced atomically; a crash mid-write leaves at most a ``*.tmp`` folder
that :func:`latest` ignores.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from mmfl.engine.state import LazyTensors
from mmfl.errors import MMFLError


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(ckpt_root: Path, rnd: int, server: dict[str, Tensor],
         clients: dict[str, Tensor] | Callable[[str], None], meta: dict, keep: int = 1) -> Path:
    """``clients``: the client-state tensors, or a function writing them to the path it is
    given (a disk-backed store streams its changes without holding them in memory)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"round_{rnd:05d}"
    tmp = ckpt_root / f"round_{rnd:05d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in server.items()}, str(tmp / "server.safetensors"))
    if callable(clients):
        clients(str(tmp / "clients.safetensors"))
    else:
        save_file({k: v.contiguous() for k, v in clients.items()}, str(tmp / "clients.safetensors"))
    _atomic_write_text(tmp / "meta.json", json.dumps(meta))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write_text(ckpt_root / "LATEST", final.name)
    for old in sorted(ckpt_root.glob("round_?????"))[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest(ckpt_root: Path) -> Path | None:
    pointer = ckpt_root / "LATEST"
    if not pointer.is_file():
        return None
    path = ckpt_root / pointer.read_text().strip()
    if not (path / "meta.json").is_file():
        raise MMFLError(f"{pointer}: points to {path.name}, which is missing or incomplete; "
                        "the run's checkpoints are damaged (start over with --overwrite)")
    return path


def load(path: Path, lazy_clients: bool = False) -> tuple[dict[str, Tensor], Mapping[str, Tensor], dict]:
    """``lazy_clients``: the client part as a mapping that reads one tensor per access."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        server = load_file(str(path / "server.safetensors"))
        cpath = str(path / "clients.safetensors")
        clients = LazyTensors(cpath) if lazy_clients else load_file(cpath)
    except (OSError, ValueError, SafetensorError) as e:
        raise MMFLError(f"{path}: checkpoint is unreadable ({e})") from None
    return server, clients, meta
