"""What the ServerApp receives, on disk: an audit of the server's view (docs/flower.md).

With the environment variable ``MMFL_FLOWER_TAP=DIR`` set where the ServerApp runs (the
SuperLink's environment), :func:`recording_grid` wraps the ``Grid`` so that every message
the ServerApp pulls is written to ``DIR/NNNNNN.pkl`` before mmfl reads it: a dict with the
message type, the sending node, the error (if any) and every record's content (arrays as
numpy arrays, config and metric values as they came). :func:`load` reads them back. Tests
use it to show that with ``[secure_aggregation]`` no individual update reaches the server.
"""

from __future__ import annotations

import itertools
import os
import pickle
from pathlib import Path

ENV = "MMFL_FLOWER_TAP"


def dump(msg) -> dict:
    """A plain-Python copy of a received Flower message."""
    out = {"message_type": msg.metadata.message_type, "src_node_id": msg.metadata.src_node_id,
           "error": None, "records": {}}
    if msg.has_error():
        out["error"] = (msg.error.code, msg.error.reason)
        return out
    for name, rec in msg.content.array_records.items():
        out["records"][name] = {k: a.numpy() for k, a in rec.items()}
    for name, rec in msg.content.metric_records.items():
        out["records"][name] = dict(rec)
    for name, rec in msg.content.config_records.items():
        out["records"][name] = dict(rec)
    return out


class RecordingGrid:
    """A Grid that writes every message it hands to the ServerApp to ``folder``."""

    def __init__(self, grid, folder: str | Path):
        self._grid = grid
        self._folder = Path(folder)
        self._folder.mkdir(parents=True, exist_ok=True)
        self._count = itertools.count(len(list(self._folder.glob("*.pkl"))))

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def _keep(self, messages):
        messages = list(messages)
        if messages:  # a tap folder inside a run folder is the run's (what --overwrite may delete)
            from mmfl.engine import runfiles

            runfiles.note(self._folder, owned_dir=True)
        for m in messages:
            path = self._folder / f"{next(self._count):06d}-{os.getpid()}.pkl"
            path.write_bytes(pickle.dumps(dump(m)))
        return messages

    def pull_messages(self, message_ids):
        return self._keep(self._grid.pull_messages(message_ids))

    def send_and_receive(self, messages, *, timeout=None):
        return self._keep(self._grid.send_and_receive(messages, timeout=timeout))


def recording_grid(grid):
    """``grid`` wrapped by a :class:`RecordingGrid` when ``MMFL_FLOWER_TAP`` is set, else ``grid``."""
    folder = os.environ.get(ENV)
    return RecordingGrid(grid, folder) if folder else grid


def load(folder: str | Path) -> list[dict]:
    """The messages a :class:`RecordingGrid` wrote, in order."""
    return [pickle.loads(p.read_bytes()) for p in sorted(Path(folder).glob("*.pkl"))]
