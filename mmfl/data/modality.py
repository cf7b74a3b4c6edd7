"""Modality heterogeneity: which modalities each client holds, and which samples lack one.

After the partitioner has split the samples, a *modality assigner* (config
table ``[modalities]``) decides which modalities each client holds. A client
then sees only those modalities: its data view carries only their tensors, and
its model has only their encoders (see ``holds`` in :mod:`mmfl.models.multimodal`).
On top of that, ``missing_rate`` removes modality ``m`` from that share of a
multimodal client's samples; such samples carry ``present/<m> = False`` (see
:data:`mmfl.data.base.PRESENT`), and no sample loses all its modalities.

Registered assigners (factory ``(params, modalities, num_clients, rng) -> list[tuple]``):

- ``all``: every client holds every modality (cases A and C of FedCMI);
- ``mixed``: a ``multimodal_fraction`` of the clients (drawn at random) hold all
  modalities; each of the others holds one, split between the modalities
  evenly (``split = "balanced"``, FedCMI's code: half audio, half visual) or
  drawn independently (``"random"``) (FedCMI section 4.2, cases B and D);
- ``explicit``: the modalities of each client, listed in the config.

:data:`CASES` holds FedCMI's four settings as presets (a top-level ``case = "D"``
in the config, see :func:`mmfl.config.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from mmfl.data.base import PRESENT, ArrayDataset
from mmfl.errors import ConfigError
from mmfl.registry import Registry

# factory(params, modalities: list[str], num_clients: int, rng) -> list[tuple[str, ...]]
MODALITY_ASSIGNERS: Registry = Registry("modality assigner")

# FedCMI section 4.2: IID or Dirichlet non-IID (alpha 5 for CREMA-D), with or without modality heterogeneity.
CASES: dict[str, dict[str, dict]] = {
    "A": {"partition": {"name": "iid"}, "modalities": {"name": "all"}},
    "B": {"partition": {"name": "iid"}, "modalities": {"name": "mixed"}},
    "C": {"partition": {"name": "dirichlet", "beta": 5.0}, "modalities": {"name": "all"}},
    "D": {"partition": {"name": "dirichlet", "beta": 5.0}, "modalities": {"name": "mixed"}},
}


def _check_rates(rates: dict[str, float]) -> None:
    for m, r in rates.items():
        if not isinstance(r, (int, float)) or not 0.0 <= r < 1.0:
            raise ConfigError(f"modalities.missing_rate.{m}: must be in [0, 1), got {r!r}")


@dataclass
class AllParams:
    missing_rate: dict[str, float] = field(default_factory=dict, metadata={
        "help": "per modality, the share of each multimodal client's samples that lack it, e.g. {image = 0.3}"})

    def __post_init__(self):
        _check_rates(self.missing_rate)


@dataclass
class MixedParams:
    multimodal_fraction: float = field(default=0.5, metadata={
        "help": "share of clients holding every modality (the rest hold one)"})
    modalities: list[str] = field(default_factory=list, metadata={
        "help": "modalities a unimodal client may hold (empty = all)"})
    split: Literal["balanced", "random"] = field(default="balanced", metadata={
        "help": "unimodal clients: split evenly between the modalities, or each drawn at random"})
    missing_rate: dict[str, float] = field(default_factory=dict, metadata={
        "help": "per modality, the share of each multimodal client's samples that lack it"})

    def __post_init__(self):
        if not 0.0 <= self.multimodal_fraction <= 1.0:
            raise ConfigError(f"modalities.multimodal_fraction: must be in [0, 1], got {self.multimodal_fraction}")
        _check_rates(self.missing_rate)


@dataclass
class ExplicitParams:
    holds: list[list[str]] = field(default_factory=list, metadata={
        "help": "the modalities of each client, e.g. [[\"image\", \"audio\"], [\"audio\"], ...] (one entry per client)"})
    missing_rate: dict[str, float] = field(default_factory=dict, metadata={
        "help": "per modality, the share of each multimodal client's samples that lack it"})

    def __post_init__(self):
        _check_rates(self.missing_rate)


def _known(where: str, names, modalities: list[str]) -> None:
    for m in names:
        if m not in modalities:
            raise ConfigError(f"modalities.{where}: unknown modality {m!r} (data set has: {', '.join(modalities)})")


@MODALITY_ASSIGNERS.register("all", AllParams, help="every client holds every modality")
def assign_all(p: AllParams, modalities: list[str], num_clients: int, rng) -> list[tuple[str, ...]]:
    _known("missing_rate", p.missing_rate, modalities)
    return [tuple(modalities)] * num_clients


@MODALITY_ASSIGNERS.register("mixed", MixedParams,
                             help="a share of clients multimodal, the others one modality each (FedCMI 4.2)")
def assign_mixed(p: MixedParams, modalities: list[str], num_clients: int, rng) -> list[tuple[str, ...]]:
    _known("modalities", p.modalities, modalities)
    _known("missing_rate", p.missing_rate, modalities)
    uni_choices = list(p.modalities) or list(modalities)
    n_multi = int(round(p.multimodal_fraction * num_clients))
    order = rng.permutation(num_clients)
    holds: list[tuple[str, ...]] = [tuple(modalities)] * num_clients
    uni = sorted(int(c) for c in order[n_multi:])
    if p.split == "balanced":
        # as even as possible, which modality gets the remainder drawn at random
        picks = [uni_choices[i % len(uni_choices)] for i in range(len(uni))]
        picks = [picks[i] for i in rng.permutation(len(picks))]
    else:
        picks = [uni_choices[int(i)] for i in rng.integers(0, len(uni_choices), size=len(uni))]
    for c, m in zip(uni, picks):
        holds[c] = (m,)
    return holds


@MODALITY_ASSIGNERS.register("explicit", ExplicitParams, help="the modalities of each client, listed")
def assign_explicit(p: ExplicitParams, modalities: list[str], num_clients: int, rng) -> list[tuple[str, ...]]:
    if len(p.holds) != num_clients:
        raise ConfigError(f"modalities.holds: has {len(p.holds)} entries for {num_clients} clients")
    out = []
    for i, h in enumerate(p.holds):
        if not h:
            raise ConfigError(f"modalities.holds[{i}]: a client must hold at least one modality")
        _known(f"holds[{i}]", h, modalities)
        out.append(tuple(m for m in modalities if m in h))  # the data set's order
    _known("missing_rate", p.missing_rate, modalities)
    return out


def missing_masks(train: ArrayDataset, parts: list[np.ndarray], holds: list[tuple[str, ...]],
                  rates: dict[str, float], rng) -> dict[str, torch.Tensor]:
    """``present/<m>`` masks over the train rows: in each multimodal client, a ``rates[m]`` share
    of its samples (drawn at random) lacks ``m``; a sample about to lose every modality keeps
    one of them at random. Returns {} when no rate is positive."""
    mods = [m for m in train.modalities]
    if not any(r > 0 for r in rates.values()):
        return {}
    n = int(train.labels.shape[0])
    present = {m: np.ones(n, dtype=bool) for m in mods}
    for part, held in zip(parts, holds):
        if len(held) < 2 or len(part) == 0:
            continue
        rows = train.indices[torch.as_tensor(part)].numpy() if train.indices is not None else np.asarray(part)
        drop = np.zeros((len(rows), len(held)), dtype=bool)
        for j, m in enumerate(held):
            k = int(round(rates.get(m, 0.0) * len(rows)))
            if k:
                drop[rng.choice(len(rows), size=k, replace=False), j] = True
        for i in np.nonzero(drop.all(axis=1))[0]:  # keep one modality of a sample that lost all
            drop[i, int(rng.integers(len(held)))] = False
        for j, m in enumerate(held):
            present[m][rows[drop[:, j]]] = False
    return {PRESENT + m: torch.from_numpy(present[m]) for m in mods}


def modality_summary(holds: list[tuple[str, ...]]) -> dict[str, int]:
    """How many clients hold each combination, e.g. {"audio+image": 10, "audio": 5, "image": 5}."""
    out: dict[str, int] = {}
    for h in holds:
        key = "+".join(h)
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
