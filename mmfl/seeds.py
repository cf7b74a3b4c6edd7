"""Derived seeds: every random choice in a run is drawn from a seed derived from the run
seed and its coordinates (round, client, route, ...), so a resumed run draws exactly what an
uninterrupted one would. The lowest layer: data, models, primitives and runtime all use it."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from the run seed and coordinates (round, client, ...).

    Every random choice in a run is drawn from a seed derived this way rather
    than from a generator carried across rounds, so a resumed run draws
    exactly what an uninterrupted one would.
    """
    h = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1
