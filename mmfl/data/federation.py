"""Building a run's federation from its config: load the data set, split its training part
among the clients (the partitioner), assign modalities, simulate missing modalities, missing
labels and label noise (:mod:`mmfl.data.corruption`), and add the clients of
``[[client_data]]`` entries. Every draw is seeded from the run seed.

Cross-checks (each a one-line :class:`~mmfl.errors.ConfigError` naming both sides): a
``[[client_data]]`` data set's modalities are some of ``[data]``'s, with the same per-sample
shapes after its frozen encoders (the clients' models meet ``[data]``'s test and public sets);
``[[client_models]]`` select modalities and client ids that the federation has."""

from __future__ import annotations

import numpy as np

from mmfl.data import DATASETS, PARTITIONERS
from mmfl.data.base import PRESENT, DatasetMeta, DataSource, Federation
from mmfl.data.corruption import client_report, simulate
from mmfl.data.labels import warn_labels
from mmfl.data.manifest_missing import warn_absent_clients
from mmfl.data.modality import MODALITY_ASSIGNERS, check_missing
from mmfl.errors import ConfigError
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
    check_missing(cfg.modalities.params, mods)
    mrng = np.random.default_rng(derive_seed(cfg.run.seed, "modalities"))
    holds = MODALITY_ASSIGNERS.get(cfg.modalities.name).factory(cfg.modalities.params, mods, len(parts), mrng)
    # missing modalities (train and test), the missing-row policy, missing labels and label noise
    sim = simulate(cfg, bundle, parts, holds, mrng)
    train, test, public, meta, parts, holds = sim.train, sim.test, sim.public, sim.meta, sim.parts, sim.holds
    mods = list(meta.modalities)
    if pooled:  # centralized upper bound: one client holding the whole training split (the clients' rows)
        whole = train.subset(np.concatenate(parts)) if sim.changed and parts else train
        warn_labels(labels, bundle.test.label_array(), bundle.meta.num_classes, bundle.meta.class_names)
        return Federation(clients=[whole], test=test, meta=meta, public=public)
    clients = []
    for part, held in zip(parts, holds):
        view = train.subset(part)
        if tuple(held) != tuple(mods):  # the client sees only its modalities (and their masks)
            view = view.with_features([*held, *(PRESENT + m for m in held if PRESENT + m in view.features)])
        clients.append(view)
    report = [client_report(c, h, sim.original_labels, n) for c, h, n in zip(clients, holds, sim.counts)]
    uniform = all(h == tuple(mods) for h in holds)
    client_sources: list[int | None] = [None] * len(clients)
    sources = []
    for k, extra in enumerate(cfg.client_data):  # [[client_data]]: more clients, from other data sets
        b = DATASETS.get(extra.data.name).factory(extra.data.params)
        check_source(k, b.meta, meta)
        prng = np.random.default_rng(derive_seed(cfg.run.seed, "partition", "client_data", k))
        ids = b.client_ids.numpy() if b.client_ids is not None else None
        for part in PARTITIONERS.get(extra.partition.name).factory(b.train.label_array(), extra.partition.params,
                                                                   prng, client_ids=ids):
            clients.append(b.train.subset(part))
            holds.append(tuple(b.meta.modalities))
            client_sources.append(k)
        sources.append(DataSource(meta=b.meta, test=b.test))
    check_client_models(cfg.client_models, mods, len(clients))
    groups = [next((g for g, entry in enumerate(cfg.client_models) if entry.matches(cid, h)), None)
              for cid, h in enumerate(holds)]
    check_labels(cfg, bundle, clients, client_sources, sources)
    warn_absent_clients(clients, mods, client_labels(bundle.meta, cfg.partition, range(len(clients))))
    return Federation(clients=clients, test=test, meta=meta, public=public, simulated=report,
                      client_modalities=None if uniform and not sources else holds,
                      client_groups=groups if any(g is not None for g in groups) else None,
                      client_sources=client_sources if sources else None, sources=sources)


def check_labels(cfg: ExperimentConfig, bundle, clients, client_sources, sources) -> None:
    """The label warnings of :mod:`mmfl.data.labels` for ``[data]`` and each ``[[client_data]]``
    source (test classes unseen in training, classes with few training rows, single-class clients;
    the last not with ``k_classes``, where the classes per client are the user's choice)."""
    for src, meta, test, train in [(None, bundle.meta, bundle.test, bundle.train.label_array()),
                                   *[(k, s.meta, s.test, None) for k, s in enumerate(sources)]]:
        mine = [c for c, s in zip(clients, client_sources) if s == src]
        ys = [c.label_array() for c in mine]
        if train is None:
            train = np.concatenate(ys) if ys else np.zeros(0, np.int64)
        entry = cfg.partition if src is None else cfg.client_data[src].partition
        ids = [cid for cid, s in enumerate(client_sources) if s == src]
        warn_labels(train, test.label_array(), meta.num_classes, meta.class_names, ys,
                    what="" if src is None else f"client_data[{src}]: ", single_class_ok=entry.name == "k_classes",
                    client_names=client_labels(meta, entry, ids))


def client_labels(meta: DatasetMeta, partition, ids) -> list[str]:
    """How warnings name clients ``ids``: the id, with the data's own client name under the
    ``natural`` partition (a manifest's client column), e.g. ``3 (p04)``."""
    names = (meta.info or {}).get("client_names") if partition.name == "natural" else None
    return [f"{cid} ({names[j]})" if names and j < len(names) else str(cid) for j, cid in enumerate(ids)]


def _shape(s) -> tuple:
    return tuple(int(d) for d in s)


def check_source(k: int, meta: DatasetMeta, data_meta: DatasetMeta) -> None:
    """``[[client_data]]`` entry ``k``'s data set (``meta``) against ``[data]``'s (``data_meta``):
    each of its modalities is one of ``[data]``'s, with the same per-sample shape. A ConfigError
    naming the entry, the modality and both shapes otherwise."""
    ours = data_meta.modalities
    for m, shape in meta.modalities.items():
        if m not in ours:
            hint = (f"; for a manifest: rename = {{ {m} = \"{next(iter(ours))}\" }}" if meta.name == "manifest"
                    and len(ours) == 1 else "; for a manifest: its rename option" if meta.name == "manifest" else "")
            raise ConfigError(f"client_data[{k}]: modality '{m}' is not one of [data]'s modalities "
                              f"({', '.join(ours)}); name it like [data] does (data set '{meta.name}' "
                              f"has {', '.join(meta.modalities)}{hint})")
        if _shape(shape) != _shape(ours[m]):
            raise ConfigError(f"client_data[{k}].data: modality '{m}' has shape {_shape(shape)} but [data] "
                              f"'{m}' has {_shape(ours[m])} (use the same encoder or feature size for both)")
        tokens = [m in (x.info or {}).get("token_vocab_size", {}) for x in (meta, data_meta)]
        if tokens[0] != tokens[1]:
            what = ["token ids (text_encoder 'tokens')" if t else "float features" for t in tokens]
            raise ConfigError(f"client_data[{k}].data: modality '{m}' holds {what[0]} but [data] '{m}' holds "
                              f"{what[1]} (use the same text encoder for both)")


def check_client_models(entries, modalities: list[str], num_clients: int) -> None:
    """``[[client_models]]`` selectors against the federation: ``for_modalities`` names only
    its modalities, ``for_clients`` only existing client ids."""
    for i, entry in enumerate(entries):
        for m in entry.modalities:
            if m not in modalities:
                raise ConfigError(f"client_models[{i}].for_modalities: '{m}' is not a modality of this "
                                  f"federation ({', '.join(modalities)})")
        for c in entry.clients:
            if c >= num_clients:
                raise ConfigError(f"client_models[{i}].for_clients: client {c} does not exist (the federation "
                                  f"has clients 0..{num_clients - 1})")
