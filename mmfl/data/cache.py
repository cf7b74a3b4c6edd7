"""Preprocess once: an on-disk cache of tensors keyed by input content and settings.

    tensors = cached("idx-images", [path], {"scale": 255}, lambda: {"x": decode(path)})

The key hashes the namespace, the settings (as sorted JSON) and the *content*
of every input file (BLAKE2b of its bytes). Hashing a large file on every run
would cost a read of it, so each file's digest is remembered next to the cache
(``digests.json``) under its path, size and modification time: an unchanged
file costs one ``stat``; a touched or rewritten one is hashed again. The
tensors are stored with safetensors in ``$MMFL_CACHE_DIR`` (default
``~/.cache/mmfl``), written to a temporary name and renamed into place, so a
crash never leaves a partial entry; an unreadable entry is recomputed.

Used by the IDX loaders (Fashion-MNIST decoding: seconds -> milliseconds) and
meant for audio features (log-mel) and frozen-encoder embeddings: put every
setting that changes the output (sample rate, window, model name and
revision, ...) into ``settings`` and bump ``version`` when the code changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from torch import Tensor

ENV = "MMFL_CACHE_DIR"


def cache_dir() -> Path:
    """``$MMFL_CACHE_DIR``, else ``~/.cache/mmfl``."""
    return Path(os.environ.get(ENV) or "~/.cache/mmfl").expanduser()


def file_digest(path: str | Path, root: Path | None = None) -> str:
    """BLAKE2b of a file's bytes, remembered by (path, size, mtime) in ``root/digests.json``."""
    path = Path(path).resolve()
    st = path.stat()
    root = root or cache_dir()
    memo_path = root / "digests.json"
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    hit = memo.get(str(path))
    if hit and hit.get("stamp") == stamp:
        return hit["digest"]
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    memo[str(path)] = {"stamp": stamp, "digest": digest}
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_name(f"digests.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_path)
    except OSError:
        pass  # a read-only cache still works, it just hashes again next time
    return digest


def cache_key(namespace: str, files: list[str | Path], settings: dict, version: int = 1,
              root: Path | None = None) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"ns": namespace, "v": version, "settings": settings}, sort_keys=True,
                        default=str).encode())
    for f in files:
        h.update(file_digest(f, root).encode())
    return h.hexdigest()


def cached(namespace: str, files: list[str | Path], settings: dict, compute: Callable[[], dict[str, Tensor]],
           version: int = 1, root: str | Path | None = None) -> dict[str, Tensor]:
    """``compute()`` once per (namespace, version, settings, input contents); later calls load it.

    ``compute`` returns named tensors. ``root`` overrides :func:`cache_dir`.
    If the cache folder cannot be written, the result is computed and returned uncached.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    root = Path(root) if root is not None else cache_dir()
    key = cache_key(namespace, files, settings, version, root)
    path = root / namespace / f"{key}.safetensors"
    if path.is_file():
        try:
            return load_file(str(path))
        except (OSError, SafetensorError, ValueError):
            pass  # damaged: compute again and replace it
    tensors = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        os.replace(tmp, path)
    except OSError:
        pass
    return tensors


# ----------------------------------------------------------------------------- first-run notices

def _tilde(path: Path) -> str:
    """``path`` with the home folder written as ``~``."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def announce(what: str, namespace: str, root: str | Path | None = None) -> None:
    """One line on stderr before a slow preprocessing step that runs on a cache miss only:
    ``mmfl: <what> (first run only; cached in <cache folder>/<namespace>)``. Call it inside
    :func:`cached`'s ``compute``, so a cache hit prints nothing. ``$MMFL_QUIET=1`` silences it."""
    import sys

    if os.environ.get("MMFL_QUIET"):
        return
    folder = (Path(root) if root is not None else cache_dir()) / namespace
    print(f"mmfl: {what} (first run only; cached in {_tilde(folder)})", file=sys.stderr, flush=True)


def progress(iterable, total: int, unit: str, desc: str):
    """``iterable`` with a tqdm bar on stderr when stderr is a terminal (``disable=None``: no bar
    in a log file or a pipe, and none under ``$MMFL_QUIET``)."""
    if os.environ.get("MMFL_QUIET"):
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, unit=unit, desc=desc, disable=None, leave=False, dynamic_ncols=True)
