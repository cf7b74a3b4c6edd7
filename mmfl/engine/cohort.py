"""Who takes part in a round: the cohort size and the seeded draw of each round's clients."""

from __future__ import annotations

import numpy as np

from mmfl.errors import ConfigError
from mmfl.schema import ExperimentConfig
from mmfl.seeds import derive_seed


def cohort_size(cfg: ExperimentConfig, num_clients: int) -> int:
    """The number of clients sampled per round."""
    return cfg.run.clients_per_round or max(1, int(round(cfg.run.sample_fraction * num_clients)))


def sample_cohort(cfg: ExperimentConfig, rnd: int, num_clients: int) -> list[int]:
    """The clients of round ``rnd``: a seeded draw without replacement."""
    k = cohort_size(cfg, num_clients)
    if k > num_clients:
        raise ConfigError(f"clients_per_round: {k} exceeds the number of clients ({num_clients})")
    if k == num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(cfg.run.seed, rnd, "cohort"))
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))
