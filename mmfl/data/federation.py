"""Building a run's federation from its config: load the data set, split its training part
among the clients (the partitioner), assign modalities (and missing-sample masks), and add
the clients of ``[[client_data]]`` entries. Every draw is seeded from the run seed."""

from __future__ import annotations

import numpy as np

from mmfl.data import DATASETS, PARTITIONERS
from mmfl.data.base import ArrayDataset, DataSource, Federation
from mmfl.data.modality import MODALITY_ASSIGNERS, missing_masks
from mmfl.schema import ExperimentConfig
from mmfl.seeds import derive_seed


def build_federation(cfg: ExperimentConfig, pooled: bool = False) -> Federation:
    """Load the data set, split its training part among clients and assign modalities."""
    bundle = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    labels = bundle.train.label_array()
    client_ids = bundle.client_ids.numpy() if bundle.client_ids is not None else None
    rng = np.random.default_rng(derive_seed(cfg.run.seed, "partition"))
    parts = PARTITIONERS.get(cfg.partition.name).factory(labels, cfg.partition.params, rng, client_ids=client_ids)
    mods = list(bundle.meta.modalities)
    mrng = np.random.default_rng(derive_seed(cfg.run.seed, "modalities"))
    holds = MODALITY_ASSIGNERS.get(cfg.modalities.name).factory(cfg.modalities.params, mods, len(parts), mrng)
    masks = missing_masks(bundle.train, parts, holds, cfg.modalities.params.missing_rate, mrng)
    train = bundle.train
    if masks:
        train = ArrayDataset({**train.features, **masks}, train.labels, train.indices)
    if pooled:  # centralized upper bound: one client holding the whole training split
        return Federation(clients=[train], test=bundle.test, meta=bundle.meta, public=bundle.public)
    clients = []
    for part, held in zip(parts, holds):
        view = train.subset(part)
        if tuple(held) != tuple(mods):
            view = view.with_features(held)  # the client sees only its modalities
        clients.append(view)
    holds = [tuple(h) for h in holds]
    uniform = all(h == tuple(mods) for h in holds)
    client_sources: list[int | None] = [None] * len(clients)
    sources = []
    for k, extra in enumerate(cfg.client_data):  # [[client_data]]: more clients, from other data sets
        b = DATASETS.get(extra.data.name).factory(extra.data.params)
        prng = np.random.default_rng(derive_seed(cfg.run.seed, "partition", "client_data", k))
        ids = b.client_ids.numpy() if b.client_ids is not None else None
        for part in PARTITIONERS.get(extra.partition.name).factory(b.train.label_array(), extra.partition.params,
                                                                   prng, client_ids=ids):
            clients.append(b.train.subset(part))
            holds.append(tuple(b.meta.modalities))
            client_sources.append(k)
        sources.append(DataSource(meta=b.meta, test=b.test))
    groups = [next((g for g, entry in enumerate(cfg.client_models) if entry.matches(cid, h)), None)
              for cid, h in enumerate(holds)]
    return Federation(clients=clients, test=bundle.test, meta=bundle.meta, public=bundle.public,
                      client_modalities=None if uniform and not sources else holds,
                      client_groups=groups if any(g is not None for g in groups) else None,
                      client_sources=client_sources if sources else None, sources=sources)
