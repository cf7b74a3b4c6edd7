"""Client state on a SuperNode's disk, so that a Flower run can be resumed.

Flower keeps a ClientApp's ``context.state`` in the SuperNode's memory, per run: a
new ``flwr run`` (which is what a resumed mmfl run is) or a restarted SuperNode starts
from an empty one. So a SuperNode started with ``--node-config 'state-dir="DIR"'``
writes each hosted client's persistent state (``ctx.state``: MOON's previous model,
SCAFFOLD's control variate, FedCMI's private projectors) to ``DIR`` after every
message, and reads it from there; the server never holds it (see docs/flower.md,
"Resuming a Flower run", for why it is not re-sent by the server instead).

Layout: ``DIR/<state id>/c<cid>/r<round>.safetensors``, one version per client and
round (round 0-based; an empty file: the state was cleared). The state id is made by
the ServerApp when the run folder is created (``flower_state.json`` there) and kept on
resume, so a fresh run of the same config (``--overwrite``) never reads an older run's
state. The round loop checkpoints after each round; after a resume from the checkpoint
of ``R`` completed rounds, the first message of round ``R`` to a client reads its
newest version from a round before ``R`` (versions of the interrupted round are
dropped), which is exactly the state the simulator's checkpoint holds. Versions older
than the last ``keep_checkpoints`` rounds are pruned, except the newest of them.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor

from mmfl.errors import MMFLError

NODE_KEY = "state-dir"  # node config: where this SuperNode keeps its clients' state
_VERSION = re.compile(r"r(\d{6})\.safetensors")
_ID = re.compile(r"[0-9a-f]{32}")


class NodeStateDir:
    """The hosted clients' state of one run under ``root/state_id``."""

    def __init__(self, root: str | Path, state_id: str, keep: int = 1):
        if not _ID.fullmatch(state_id):
            raise MMFLError(f"client-state id {state_id!r} is not a 32-digit hex id")
        self.root = Path(root).expanduser()
        self.dir = self.root / state_id
        self.keep = max(1, int(keep))

    def exists(self) -> bool:
        return self.dir.is_dir()

    def _versions(self, cid: int) -> list[tuple[int, Path]]:
        d = self.dir / f"c{cid}"
        if not d.is_dir():
            return []
        out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _VERSION.fullmatch(p.name))]
        return sorted(out)

    def load(self, cid: int, rnd: int, call: int) -> dict[str, Tensor]:
        """Client ``cid``'s state for its message ``call`` of round ``rnd``: on its first
        message of a round the newest version of an earlier round (a version of round
        ``rnd`` or later was left by an interrupted attempt: dropped), else round ``rnd``'s."""
        versions = self._versions(cid)
        if call == 0:
            for r, p in versions:
                if r >= rnd:
                    p.unlink(missing_ok=True)
            versions = [(r, p) for r, p in versions if r < rnd]
        else:
            versions = [(r, p) for r, p in versions if r <= rnd]
        if not versions:
            return {}
        path = versions[-1][1]
        try:
            return load_file(str(path))
        except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
            raise MMFLError(f"{path}: client state is unreadable ({e})") from None

    def has_state_before(self, cid: int, rnd: int) -> bool:
        """Whether client ``cid`` has a version from a round before ``rnd``."""
        return any(r < rnd for r, _ in self._versions(cid))

    def save(self, cid: int, rnd: int, state: dict[str, Tensor]) -> None:
        """Write client ``cid``'s state after a message of round ``rnd`` (durably), then prune."""
        d = self.dir / f"c{cid}"
        d.mkdir(parents=True, exist_ok=True)
        final = d / f"r{rnd:06d}.safetensors"
        tmp = d / f".r{rnd:06d}.tmp"
        save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, str(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        self._prune(cid, rnd)

    def _prune(self, cid: int, rnd: int) -> None:
        """Keep the versions a resume from one of the last ``keep`` checkpoints may need."""
        old = [(r, p) for r, p in self._versions(cid) if r < rnd - self.keep]
        for _, p in old[:-1]:
            p.unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
