"""Modality heterogeneity: which modalities each client holds, and which samples lack one.

After the partitioner has split the samples, a *modality assigner* (config
table ``[modalities]``) decides which modalities each client holds. A client
then sees only those modalities: its data view carries only their tensors, and
its model has only their encoders (see ``holds`` in :mod:`mmfl.models.multimodal`).
On top of that (:class:`MissingParams`, every assigner's), ``missing_rate`` removes
modality ``m`` from that share of each multimodal client's train samples and
``test_missing_rate`` from that share of the test samples; such samples carry
``present/<m> = False`` (see :data:`mmfl.data.base.PRESENT`) and zeros in ``m``'s rows
(:mod:`mmfl.data.corruption`), and no sample loses all its modalities.
``missing_policy`` says which rows train: all, masked (``mask``); only complete ones
(``complete_rows``); or none of modality ``m`` (``drop_modality:<m>``).

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


def _check_rates(key: str, rates) -> None:
    if not isinstance(rates, dict):
        raise ConfigError(f"modalities.{key}: must be a table of modality = rate, e.g. {{audio = 0.3}}, got {rates!r}")
    for m, r in rates.items():
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r < 1.0:
            raise ConfigError(f"modalities.{key}.{m}: must be in [0, 1), got {r!r}")


POLICIES = ("mask", "complete_rows", "drop_modality:<m>")


@dataclass
class MissingParams:
    """What every assigner takes on top of its own parameters: the simulated per-sample
    missingness of train and test rows, and how training treats a row that lacks a modality."""

    missing_rate: dict[str, float] = field(default_factory=dict, metadata={
        "help": "per modality, the share of each multimodal client's TRAIN samples that lack it, e.g. {image = 0.3}"})
    test_missing_rate: dict[str, float] = field(default_factory=dict, metadata={
        "help": "per modality, the share of the shared TEST set's samples that lack it (no sample lacks all)"})
    missing_policy: str = field(default="mask", metadata={
        "help": "training rows that lack a modality: 'mask' (train on every row, the absent modality "
                "masked), 'complete_rows' (train only on rows holding every modality the client holds), "
                "or 'drop_modality:<m>' (run without modality m: train, test and model)"})

    def __post_init__(self):
        _check_rates("missing_rate", self.missing_rate)
        _check_rates("test_missing_rate", self.test_missing_rate)
        pol = self.missing_policy
        if not isinstance(pol, str) or not (pol in ("mask", "complete_rows")
                                            or (pol.startswith("drop_modality:") and pol.split(":", 1)[1])):
            raise ConfigError(f"modalities.missing_policy: must be 'mask', 'complete_rows' or "
                              f"'drop_modality:<m>' (e.g. 'drop_modality:audio'), got {pol!r}")

    @property
    def dropped_modality(self) -> str | None:
        """The ``m`` of ``missing_policy = "drop_modality:<m>"`` (None for the other policies)."""
        pol = self.missing_policy
        return pol.split(":", 1)[1] if pol.startswith("drop_modality:") else None


def check_missing(p: MissingParams, modalities: list[str]) -> None:
    """The modality names of ``missing_rate``, ``test_missing_rate`` and ``drop_modality:<m>``
    against the data set's (one ConfigError line naming the key)."""
    _known("missing_rate", p.missing_rate, modalities)
    _known("test_missing_rate", p.test_missing_rate, modalities)
    drop = p.dropped_modality
    if drop is not None:
        _known("missing_policy", [drop], modalities)
        if len(modalities) < 2:
            raise ConfigError(f"modalities.missing_policy: drop_modality:{drop} needs a data set with at least "
                              f"two modalities (this one has {', '.join(modalities)})")


@dataclass
class AllParams(MissingParams):
    pass


@dataclass
class _MixedOwn:
    multimodal_fraction: float = field(default=0.5, metadata={
        "help": "share of clients holding every modality (the rest hold one)"})
    modalities: list[str] = field(default_factory=list, metadata={
        "help": "modalities a unimodal client may hold (empty = all)"})
    split: Literal["balanced", "random"] = field(default="balanced", metadata={
        "help": "unimodal clients: split evenly between the modalities, or each drawn at random"})


@dataclass
class MixedParams(MissingParams, _MixedOwn):  # its own parameters first (dataclass fields: reverse MRO)
    def __post_init__(self):
        if not 0.0 <= self.multimodal_fraction <= 1.0:
            raise ConfigError(f"modalities.multimodal_fraction: must be in [0, 1], got {self.multimodal_fraction}")
        super().__post_init__()


@dataclass
class _ExplicitOwn:
    holds: list[list[str]] = field(default_factory=list, metadata={
        "help": "the modalities of each client, e.g. [[\"image\", \"audio\"], [\"audio\"], ...] (one entry per client)"})


@dataclass
class ExplicitParams(MissingParams, _ExplicitOwn):
    pass


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


def draw_absent(n: int, held: tuple[str, ...], rates: dict[str, float], rng,
                initial: np.ndarray | None = None) -> np.ndarray:
    """``[n, len(held)]`` bool: which of ``n`` samples lack each held modality. Modality ``j``
    is removed from ``round(rates[m_j] * n)`` more samples (``initial``: those already lacking
    it, e.g. a manifest's empty cells), drawn at random among those that hold it and another
    modality, so no sample loses its last one; where too few are left (rates summing above 1)
    it is removed from all of those (:func:`shortfall` counts the gap)."""
    drop = np.zeros((n, len(held)), dtype=bool) if initial is None else initial.copy()
    if len(held) < 2 or n == 0:
        return drop
    for j, m in enumerate(held):
        k = int(round(rates.get(m, 0.0) * n))
        if not k:
            continue
        others = np.delete(drop, j, axis=1)
        eligible = np.nonzero(~drop[:, j] & ~others.all(axis=1))[0]  # holds m and another modality
        pick = eligible if k >= len(eligible) else eligible[rng.choice(len(eligible), size=k, replace=False)]
        drop[pick, j] = True
    return drop


def shortfall(n: int, held: tuple[str, ...], rates: dict[str, float], drop: np.ndarray,
              initial: np.ndarray | None = None) -> dict[str, int]:
    """Modality -> how many fewer samples :func:`draw_absent` removed it from than ``rates``
    asked (0s left out)."""
    out = {}
    base = np.zeros_like(drop) if initial is None else initial
    for j, m in enumerate(held):
        gap = int(round(rates.get(m, 0.0) * n)) - int((drop[:, j] & ~base[:, j]).sum())
        if gap > 0:
            out[m] = gap
    return out


def missing_masks(train: ArrayDataset, parts: list[np.ndarray], holds: list[tuple[str, ...]],
                  rates: dict[str, float], rng, short: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """``present/<m>`` masks over the train rows: in each multimodal client, a ``rates[m]`` share
    of its samples (drawn at random, :func:`draw_absent`) lacks ``m``, and no sample loses every
    modality (``short``, if given, adds up :func:`shortfall`). Returns {} when no rate is positive."""
    mods = [m for m in train.modalities]
    if not any(r > 0 for r in rates.values()):
        return {}
    present = _present(train)
    for part, held in zip(parts, holds):
        if len(held) < 2 or len(part) == 0:
            continue
        rows = train.base_rows(part)
        _draw_into(present, rows, tuple(held), rates, rng, short)
    return {PRESENT + m: torch.from_numpy(present[m]) for m in mods}


def _draw_into(present: dict[str, np.ndarray], rows: np.ndarray, held: tuple[str, ...], rates: dict[str, float],
               rng, short: dict[str, int] | None) -> None:
    """:func:`draw_absent` over the underlying ``rows`` (their current absences kept), written
    into ``present`` in place; ``short`` adds up :func:`shortfall`."""
    initial = np.stack([~present[m][rows] for m in held], axis=1)
    drop = draw_absent(len(rows), held, rates, rng, initial)
    for j, m in enumerate(held):
        present[m][rows[drop[:, j]]] = False
    _add(short, shortfall(len(rows), held, rates, drop, initial))


def _add(total: dict[str, int] | None, more: dict[str, int]) -> None:
    if total is not None:
        for m, k in more.items():
            total[m] = total.get(m, 0) + k


def _present(data: ArrayDataset) -> dict[str, np.ndarray]:
    """Modality -> bool ``[N]`` over the underlying rows: the data set's own ``present/<m>``
    masks (copied), all True where it has none."""
    n = int(data.labels.shape[0])
    out = {}
    for m in data.modalities:
        old = data.features.get(PRESENT + m)
        out[m] = old.cpu().numpy().astype(bool).copy() if old is not None else np.ones(n, dtype=bool)
    return out


def missing_test_masks(test: ArrayDataset, rates: dict[str, float], rng,
                       short: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """``present/<m>`` masks over the test rows: a ``rates[m]`` share of the test samples (this
    view's rows) lacks ``m`` (:func:`draw_absent`: exact counts, no sample lacks all). {} when no
    rate is positive."""
    if not any(r > 0 for r in rates.values()):
        return {}
    mods = tuple(test.modalities)
    present = _present(test)  # a data set's own masks (a manifest's empty cells) stay
    rows = test.base_rows()
    _draw_into(present, rows, mods, rates, rng, short)
    return {PRESENT + m: torch.from_numpy(present[m]) for m in mods}


def modality_summary(holds: list[tuple[str, ...]]) -> dict[str, int]:
    """How many clients hold each combination, e.g. {"audio+image": 10, "audio": 5, "image": 5}."""
    out: dict[str, int] = {}
    for h in holds:
        key = "+".join(h)
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
