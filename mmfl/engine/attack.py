"""Attack simulation (``[attack]``): a seeded fraction of the clients is malicious for the
whole run and changes what it does.

- ``label_flip``: the client trains on its data with every label ``y`` replaced by
  ``C - 1 - y`` (``C`` classes), applied to its training view before training.
- Every other kind changes the client's ``train`` reply after training. With ``g`` what the
  client received under the same key (zeros where it received nothing, e.g. CreamFL's
  representations) and ``w`` what it computed, every floating array becomes:

  ============== =================================================================
  sign_flip      ``g - scale * (w - g)`` (the update reversed and scaled)
  scale          ``g + scale * (w - g)``
  gaussian       ``g + N(0, noise_std^2)`` per entry (the update replaced by noise)
  constant       ``g + target`` (a constant update, backdoor-like)
  shuffle_reps   2-D arrays the client did not receive (representations ``[P, d]``):
                 rows permuted, so no row matches its public sample
  random_reps    the same arrays replaced by ``N(0, s^2)``, ``s`` their std
  ============== =================================================================

  ``inflate_examples`` leaves the arrays alone and sets ``num_examples`` and every
  ``examples/<module>`` scalar to ``examples``. Integer arrays are never changed.

The runtime applies it (:func:`mmfl.engine.client_runtime.run_client`, hence in the
simulation and on a Flower SuperNode alike); the random draws come from the message's
client seed, so a run is reproducible.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mmfl.core.message import Message
from mmfl.data.base import ArrayDataset
from mmfl.schema import REPRESENTATION_ATTACKS, AttackConfig
from mmfl.seeds import derive_seed


def malicious_clients(fraction: float, num_clients: int, seed: int) -> list[int]:
    """The malicious clients: ``round(fraction * num_clients)`` ids drawn without replacement
    from a seed derived from the run seed (the same set every round and on resume)."""
    k = int(round(fraction * num_clients))
    if k == 0:
        return []
    rng = np.random.default_rng(derive_seed(seed, "attack"))
    return sorted(int(c) for c in rng.choice(num_clients, size=min(k, num_clients), replace=False))


def flip_labels(data: ArrayDataset, num_classes: int) -> ArrayDataset:
    """``data`` with labels ``y -> num_classes - 1 - y`` (the same features, no copy of them)."""
    return ArrayDataset(data.features, (num_classes - 1) - data.labels, data.indices, data.device)


def attack_arrays(kind: str, received: dict[str, Tensor], sent: dict[str, Tensor], cfg: AttackConfig,
                  generator: torch.Generator) -> dict[str, Tensor]:
    """The arrays of a malicious reply: ``sent`` changed by ``kind`` (see the module docstring);
    ``received`` are the arrays of the message the client answers. The random draws come from
    ``generator`` on the CPU (the same on every device) and are moved to each array's device."""
    out = {}
    for key, w in sent.items():
        if not w.is_floating_point():
            out[key] = w
            continue
        g = received.get(key)
        got = g is not None and g.shape == w.shape
        g = g.to(w.dtype) if got else torch.zeros_like(w)
        if kind == "sign_flip":
            out[key] = g - cfg.scale * (w - g)
        elif kind == "scale":
            out[key] = g + cfg.scale * (w - g)
        elif kind == "gaussian":
            out[key] = g + cfg.noise_std * torch.randn(w.shape, generator=generator, dtype=w.dtype,
                                                       device="cpu").to(w.device)
        elif kind == "constant":
            out[key] = g + cfg.target
        elif kind in REPRESENTATION_ATTACKS and not got and w.dim() == 2:
            if kind == "shuffle_reps":
                out[key] = w[torch.randperm(w.shape[0], generator=generator, device="cpu").to(w.device)]
            else:
                s = float(w.std()) if w.numel() > 1 else 1.0
                out[key] = s * torch.randn(w.shape, generator=generator, dtype=w.dtype, device="cpu").to(w.device)
        else:
            out[key] = w
    return out


class Attack:
    """The run's attack: who is malicious and what it does (``[attack]``, :class:`AttackConfig`)."""

    def __init__(self, cfg: AttackConfig, num_clients: int, seed: int):
        self.cfg = cfg
        self.kind = cfg.kind
        self.clients = malicious_clients(cfg.fraction, num_clients, seed)
        self._set = set(self.clients)

    @property
    def active(self) -> bool:
        return bool(self.clients)

    def is_malicious(self, cid: int) -> bool:
        return cid in self._set

    def training_data(self, cid: int, data: ArrayDataset, num_classes: int) -> ArrayDataset:
        """The data client ``cid`` trains on (label flip for a malicious one)."""
        if self.kind == "label_flip" and cid in self._set:
            return flip_labels(data, num_classes)
        return data

    def reply(self, cid: int, route: str, msg: Message, reply: Message, seed: int) -> Message:
        """Client ``cid``'s reply on ``route`` as it sends it (changed when it is malicious,
        the route is ``train`` and the kind changes replies). ``seed``: the message's client seed."""
        if cid not in self._set or route != "train" or self.kind == "label_flip":
            return reply
        if self.kind == "inflate_examples":
            n = self.cfg.examples
            scalars = {k: (n if k == "num_examples" or k.startswith("examples/") else v)
                       for k, v in reply.scalars.items()}
            scalars.setdefault("num_examples", n)
            return Message(arrays=dict(reply.arrays), scalars=scalars)
        gen = torch.Generator(device="cpu").manual_seed(derive_seed(seed, "attack") % (2 ** 63))
        with torch.no_grad():
            arrays = attack_arrays(self.kind, msg.arrays, reply.arrays, self.cfg, gen)
        return Message(arrays=arrays, scalars=dict(reply.scalars))


def make_attack(cfg: AttackConfig | None, num_clients: int, seed: int) -> Attack | None:
    """The run's :class:`Attack` (None: no ``[attack]`` table)."""
    return None if cfg is None else Attack(cfg, num_clients, seed)
