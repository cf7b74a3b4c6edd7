"""The engine-owned store of per-client state between rounds.

Client code never keeps objects alive between messages (on Flower a client is
rebuilt for every message); what must persist (MOON's previous model,
SCAFFOLD's control variate, a SOLO client's model) is a dict of tensors the
engine loads before and saves after each message.
"""

from __future__ import annotations

from torch import Tensor


class ClientStateStore:
    """In-memory store: ``cid -> {name: tensor}``; flattens for checkpoints."""

    def __init__(self):
        self._states: dict[int, dict[str, Tensor]] = {}

    def load(self, cid: int) -> dict[str, Tensor]:
        return dict(self._states.get(cid, {}))

    def save(self, cid: int, state: dict[str, Tensor]) -> None:
        if state:
            self._states[cid] = {k: v.detach() for k, v in state.items()}
        else:
            self._states.pop(cid, None)

    def __len__(self) -> int:
        return len(self._states)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in self._states.values() for t in s.values())

    def state_dict(self) -> dict[str, Tensor]:
        """Flat ``"{cid}/{name}" -> tensor`` (for safetensors)."""
        return {f"{cid}/{k}": t.contiguous() for cid, s in self._states.items() for k, t in s.items()}

    def load_state_dict(self, flat: dict[str, Tensor]) -> None:
        self._states = {}
        for key, t in flat.items():
            cid, name = key.split("/", 1)
            self._states.setdefault(int(cid), {})[name] = t
