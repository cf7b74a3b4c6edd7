"""Resolving an experiment config: TOML file + ``--set key=value`` overrides, validated
against the registries into the typed :mod:`mmfl.schema` (whose names this module
re-exports). A layer above the runtime: only the CLI, Flower apps, sweeps and user code
import it.

A config has top-level run settings and one table per component::

    name = "moon-fmnist"        # run folder: <output_dir>/<name>
    seed = 0
    rounds = 50
    sample_fraction = 1.0       # or clients_per_round = 10
    eval_every = 1

    [data]                      # name + the data set's parameters
    name = "fashion_mnist"
    [partition]
    name = "dirichlet"
    num_clients = 10
    beta = 0.5
    [[client_models]]           # optional: other model sizes for some clients
    for_modalities = ["image"]  # (or for_clients = [0, 3]); other keys override [model]
    feat_dim = 64
    [modalities]                # who holds which modality (default: everyone, all)
    name = "all"
    [model]
    name = "simple_cnn"
    [algorithm]
    name = "moon"
    mu = 1.0
    [train]                     # local training, shared by every algorithm
    local_epochs = 10
    [privacy]                   # optional: what may leave a client (off when absent)
    modalities = { audio = "private", image = "shareable" }
    labels = "private"
    [system]                    # optional: simulated wireless latency (off when absent)
    bandwidth_hz = 1e6
    [attack]                    # optional: malicious clients (off when absent; mmfl.engine.attack)
    kind = "sign_flip"
    fraction = 0.1
    [dp]                        # optional: client- or sample-level differential privacy (off when absent)
    mode = "central"
    [secure_aggregation]        # optional, Flower only: SecAgg+ for the train round's sum (off when absent)
    protocol = "secaggplus"
    [tracking]                  # optional: TensorBoard / MLflow / W&B, offline (off when absent; docs/tracking.md)
    backends = ["tensorboard"]
    [reference]                 # optional, simulation only: centralized / local / sklearn references (docs/reference.md)
    [corruption]                # optional: simulated missing labels and label noise (off when absent)
    label_noise = { rate = 0.2, kind = "pair" }

Component tables are validated against the registered parameter dataclass of
the named entry, so a misspelt key is an error naming it.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path
from typing import Any

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.capabilities import algorithms_with, capabilities
from mmfl.core.aggregation import AGGREGATION_RULES, check_cohort
from mmfl.data import DATASETS, PARTITIONERS
from mmfl.data.modality import CASES, MODALITY_ASSIGNERS
from mmfl.config_raw import apply_overrides, load_raw, parse_override  # noqa: F401  (their home before)
from mmfl.errors import ConfigError
from mmfl.models import MODELS
from mmfl.registry import build_params
from mmfl.schema import (COMPONENTS, RULES, ClientData, ClientModel, Component, DPConfig,  # noqa: F401
                         ExperimentConfig, PrivacyConfig, RunConfig, SystemConfig, TrainConfig)
from mmfl.schema import AttackConfig, CorruptionConfig, ReferenceConfig, SecureAggregationConfig, TrackingConfig


DEFAULTS: dict[str, Any] = {
    "data": {"name": "mfeat"},
    "partition": {"name": "dirichlet"},
    "modalities": {"name": "all"},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
    "train": {},
}


def apply_case(raw: dict) -> dict:
    """Expand a top-level ``case = "A".."D"`` (FedCMI's settings, :data:`mmfl.data.modality.CASES`)
    into the ``[partition]`` and ``[modalities]`` tables. A table that names a different
    entry than the case is an error; other keys in the tables are kept."""
    if "case" not in raw:
        return raw
    case = raw.pop("case")
    if case not in CASES:
        raise ConfigError(f"case: must be one of {', '.join(CASES)}, got {case!r}")
    for kind, preset in CASES[case].items():
        table = raw.setdefault(kind, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{kind}: must be a table")
        if "name" in table and table["name"] != preset["name"]:
            raise ConfigError(f"{kind}.name: case {case} needs {preset['name']!r}, got {table['name']!r}")
        for k, v in preset.items():
            table.setdefault(k, v)
    return raw


def resolve(raw: dict) -> ExperimentConfig:
    """Validate a raw config dict into an :class:`ExperimentConfig`."""
    registries = {"data": DATASETS, "partition": PARTITIONERS, "modalities": MODALITY_ASSIGNERS,
                  "model": MODELS, "algorithm": ALGORITHMS}
    raw = apply_case(copy.deepcopy(raw))
    tables = {}
    for kind in (*COMPONENTS, "train"):
        table = raw.pop(kind, None)
        if table is None:
            table = dict(DEFAULTS[kind])
        if not isinstance(table, dict):
            raise ConfigError(f"{kind}: must be a table")
        tables[kind] = table
    groups_raw = raw.pop("client_models", [])
    sources_raw = raw.pop("client_data", [])
    privacy_raw = raw.pop("privacy", None)
    system_raw = raw.pop("system", None)
    attack_raw = raw.pop("attack", None)
    dp_raw = raw.pop("dp", None)
    secagg_raw = raw.pop("secure_aggregation", None)
    tracking_raw = raw.pop("tracking", None)
    reference_raw = raw.pop("reference", None)
    corruption_raw = raw.pop("corruption", None)
    run_fields = {f.name for f in fields(RunConfig)}
    for key in raw:
        if key not in run_fields:
            known = sorted(run_fields | set(tables) | {"attack", "case", "client_data", "client_models", "dp", "privacy",
                                                       "reference", "secure_aggregation", "system", "tracking",
                                                       "corruption"})
            raise ConfigError(f"{key}: unknown config key (known: {', '.join(known)})")
    run = build_params("", "settings", RunConfig, raw)
    comps = {}
    for kind in COMPONENTS:
        table = dict(tables[kind])
        name = table.pop("name", DEFAULTS[kind]["name"])
        if not isinstance(name, str):
            raise ConfigError(f"{kind}.name: expected a string, got {name!r}")
        params = registries[kind].params(name, table)
        comps[kind] = Component(name, table, params)
    train = build_params("train", "settings", TrainConfig, with_recipe_schedule(
        with_algorithm_defaults(tables["train"], ALGORITHMS.get(comps["algorithm"].name).factory)))
    groups = resolve_client_models(groups_raw, tables["model"], MODELS)
    sources = resolve_client_data(sources_raw, {"data": DATASETS, "partition": PARTITIONERS})
    privacy = resolve_privacy(privacy_raw)
    system = resolve_system(system_raw)
    dp = resolve_dp(dp_raw, comps["algorithm"])
    attack = resolve_attack(attack_raw)
    check_rule_cohort(comps["algorithm"].params, run, comps["partition"].params, sources)
    secagg = resolve_secure_aggregation(secagg_raw, comps["algorithm"], dp, run, comps["partition"].params, sources)
    tracking = resolve_tracking(tracking_raw)
    reference = resolve_reference(reference_raw)
    corruption = resolve_corruption(corruption_raw)
    return ExperimentConfig(run=run, train=train, **comps, client_models=groups, client_data=sources,
                            privacy=privacy, system=system, dp=dp, attack=attack, secure_aggregation=secagg,
                            tracking=tracking, reference=reference, corruption=corruption)


def with_algorithm_defaults(table: dict, spec) -> dict:
    """``[train]`` with the algorithm's declared ``train_defaults`` (``Server.train_defaults``,
    e.g. SCAFFOLD's ``{"optimizer": "sgd", "lr": 0.01}``: its update rule is written for SGD steps)
    for the keys the user left out; a key the user set is kept as written."""
    declared = getattr(spec.server, "train_defaults", None) or {}
    return {**declared, **table}


def with_recipe_schedule(table: dict) -> dict:
    """``[train]`` with the default recipe's learning-rate schedule: a table that names neither
    ``optimizer`` nor ``lr`` (the algorithm's declared ``train_defaults`` count as named) and no
    ``lr_schedule`` gets ``lr_schedule = "cosine"``: Adam's lr 1e-3 decays to ``lr_min`` (0) over
    the run's rounds. A decaying lr is what lets FedAvg on non-IID clients converge rather than
    circle a neighbourhood of size O(lr) (Li et al. 2020, "On the Convergence of FedAvg on
    Non-IID Data", Thm. 1 and Sec. 3.3); measured in docs/recipe.md. A table that chose its
    optimizer or lr keeps a constant lr unless it sets ``lr_schedule``, as before."""
    if "lr_schedule" in table or "optimizer" in table or "lr" in table:
        return table
    return {**table, "lr_schedule": "cosine"}


def resolve_corruption(table) -> CorruptionConfig | None:
    """Validate ``[corruption]`` (None: the table is absent, clean labels)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("corruption: must be a table, e.g. [corruption] with label_missing_rate = 0.1")
    return build_params("corruption", "settings", CorruptionConfig, table)


def resolve_tracking(table) -> TrackingConfig | None:
    """Validate ``[tracking]`` (None: the table is absent, no experiment tracking)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("tracking: must be a table, e.g. [tracking] with backends = [\"tensorboard\"]")
    if isinstance(table.get("backends"), str):  # backends = "mlflow": one back-end
        table = {**table, "backends": [table["backends"]]}
    return build_params("tracking", "settings", TrackingConfig, table)


def resolve_reference(table) -> ReferenceConfig | None:
    """Validate ``[reference]`` (None: the table is absent, no references; docs/reference.md)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("reference: must be a table, e.g. [reference] with methods = [\"centralized\"]")
    return build_params("reference", "settings", ReferenceConfig, table)


def secagg_capable(spec) -> bool:
    """Whether an algorithm's server needs only the data-weighted sum of its clients' train replies
    (its declared :attr:`~mmfl.algorithms.capabilities.Capabilities.secagg`)."""
    return capabilities(spec).secagg


def resolve_secure_aggregation(table, algo: Component, dp, run, partition, sources) -> SecureAggregationConfig | None:
    """Validate ``[secure_aggregation]`` (None: absent) against the run: SecAgg+ gives the server the
    data-weighted mean of the train replies and nothing else, so the server must need nothing else
    (no robust rule, no individual replies, no central DP's per-client clipping), and a round's sum
    must fit the modulus (clients per round * quantization_range < modulus_range)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("secure_aggregation: must be a table, e.g. [secure_aggregation] with protocol = \"secaggplus\"")
    sa = build_params("secure_aggregation", "settings", SecureAggregationConfig, table)
    spec = ALGORITHMS.get(algo.name).factory
    if not secagg_capable(spec):
        ok = algorithms_with("secagg")
        raise ConfigError(f"secure_aggregation: algorithm '{algo.name}' needs more from its clients than the "
                          f"weighted sum of their models (individual replies, control variates, "
                          f"representations or personal models); supported: {', '.join(ok)}")
    rule = getattr(algo.params, "aggregation", None)
    if rule not in (None, "weighted_mean"):
        raise ConfigError(f"secure_aggregation: algorithm.aggregation = '{rule}' combines individual updates; "
                          "the server learns only their weighted sum (use aggregation = \"weighted_mean\")")
    if dp is not None:
        raise ConfigError("secure_aggregation: [dp] clips each client's update on the server, which secure "
                          "aggregation hides; remove one of the two tables")
    num_clients = getattr(partition, "num_clients", 0) if not sources else 0
    n = run.clients_per_round or (max(1, int(round(run.sample_fraction * num_clients))) if num_clients else 0)
    if n == 1:
        raise ConfigError("secure_aggregation: a round has 1 client; the sum of one update is that update "
                          "(sample at least 2 clients per round)")
    if n and n * sa.quantization_range >= sa.modulus_range:
        raise ConfigError(f"secure_aggregation.quantization_range: {n} clients per round x {sa.quantization_range} "
                          f">= modulus_range = {sa.modulus_range}: the sum would wrap around; lower "
                          "quantization_range")
    return sa


def check_rule_cohort(algo, run, partition, sources) -> None:
    """A robust rule that needs more updates than a round has (Krum: n > 2f + 2, Bulyan: n >= 4f + 3)
    is a ConfigError here when the cohort size is known from the config; otherwise the rule says so
    at run time (e.g. fewer holders of a module than the rule needs)."""
    name = getattr(algo, "aggregation", None)
    if name not in AGGREGATION_RULES:
        return
    num_clients = getattr(partition, "num_clients", 0) if not sources else 0
    n = run.clients_per_round or (max(1, int(round(run.sample_fraction * num_clients))) if num_clients else 0)
    if n:
        check_cohort(name, getattr(algo, "aggregation_params", None), n)


def resolve_dp(table, algo: Component) -> DPConfig | None:
    """Validate ``[dp]`` (None: the table is absent, no DP) against the algorithm: client-level DP
    covers the servers that only average the replies' models (``dp_capable``, the FedAvg family);
    central DP replaces the aggregation rule by DP-FedAvg's clipped uniform mean, so it takes only the
    default averaging rules (local DP noises the updates on the clients and keeps any rule).
    Sample-level DP-SGD (``mode = "sample"``) also needs the client's local training to be SGD on a
    per-sample loss (``dpsgd_blocker`` of the client class); the model is checked when it is built."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("dp: must be a table, e.g. [dp] with mode = \"central\", noise_multiplier = 1.0")
    dp = build_params("dp", "settings", DPConfig, table)
    spec = ALGORITHMS.get(algo.name).factory
    caps = capabilities(spec)  # declared once (mmfl.algorithms.capabilities)
    if dp.mode == "rows" and "rows" not in caps.dp_modes:
        raise ConfigError(f"dp: algorithm '{algo.name}' does not support dp.mode = \"rows\" (the per-row Gaussian "
                          f"mechanism on the vectors a client sends for each of its rows; {caps.reason('dp:rows')}); "
                          f"supported: {', '.join(algorithms_with('dp:rows'))}")
    if dp.mode == "sample" and "sample" not in caps.dp_modes:
        raise ConfigError(f"dp: algorithm '{algo.name}' does not support sample-level DP-SGD (mode = \"sample\", "
                          f"per-sample gradients of the FedAvg family's local loss; {caps.reason('dp:sample')}); "
                          f"supported: {', '.join(algorithms_with('dp:sample'))}")
    if dp.mode not in caps.dp_modes:
        raise ConfigError(f"dp: algorithm '{algo.name}' does not support client-level DP (its server uses more "
                          f"of the replies than averaged models); supported: {', '.join(algorithms_with('dp:' + dp.mode))}")
    rule = getattr(algo.params, "aggregation", None)
    if dp.mode == "central" and rule not in (None, "weighted_mean", "mean"):
        raise ConfigError(f"dp.mode: central DP aggregates by DP-FedAvg's clipped uniform mean, so "
                          f"algorithm.aggregation = '{rule}' cannot be used with it; use dp.mode = \"local\" "
                          "or the default rule")
    return dp


def resolve_attack(table) -> AttackConfig | None:
    """Validate ``[attack]`` (None: the table is absent, every client honest)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("attack: must be a table, e.g. [attack] with kind = \"sign_flip\", fraction = 0.1")
    return build_params("attack", "settings", AttackConfig, table)


def resolve_system(table) -> SystemConfig | None:
    """Validate ``[system]`` (None: the table is absent, no system model)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("system: must be a table, e.g. [system] with bandwidth_hz = 1e6")
    return build_params("system", "wireless", SystemConfig, table)


def resolve_privacy(table) -> PrivacyConfig | None:
    """Validate ``[privacy]`` (None: the table is absent, no rules)."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("privacy: must be a table, e.g. [privacy] with modalities = {audio = \"private\"}")
    mods = table.get("modalities", {})
    if not isinstance(mods, dict):
        raise ConfigError(f"privacy.modalities: must be a table of modality = \"shareable\" | \"private\", "
                          f"got {mods!r}")
    for m, rule in mods.items():  # before build_params, for an error naming the modality
        if rule not in RULES:
            raise ConfigError(f"privacy.modalities.{m}: must be \"shareable\" or \"private\", got {rule!r}")
    return build_params("privacy", "settings", PrivacyConfig, table)


def resolve_client_data(entries, registries: dict) -> list[ClientData]:
    """Validate ``[[client_data]]``: each entry has a ``data`` and a ``partition`` table."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError("client_data: must be an array of tables ([[client_data]])")
    out = []
    for i, entry in enumerate(entries):
        where = f"client_data[{i}]"
        unknown = sorted(set(entry) - {"data", "partition"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key (an entry has a data and a partition table)")
        comps = {}
        for kind in ("data", "partition"):
            table = entry.get(kind)
            if not isinstance(table, dict) or not isinstance(table.get("name"), str):
                raise ConfigError(f"{where}.{kind}: must be a table with a name")
            table = dict(table)
            name = table.pop("name")
            try:
                comps[kind] = Component(name, table, registries[kind].params(name, table))
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
        out.append(ClientData(**comps))
    return out


def resolve_client_models(entries, model_table: dict, models) -> list[ClientModel]:
    """Validate ``[[client_models]]``: each entry selects clients and overrides ``[model]``."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError("client_models: must be an array of tables ([[client_models]])")
    out = []
    for i, entry in enumerate(entries):
        where = f"client_models[{i}]"
        entry = dict(entry)
        clients = entry.pop("for_clients", [])
        mods = entry.pop("for_modalities", [])
        if not isinstance(clients, list) or not all(isinstance(c, int) and c >= 0 for c in clients):
            raise ConfigError(f"{where}.for_clients: must be a list of client ids, got {clients!r}")
        if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
            raise ConfigError(f"{where}.for_modalities: must be a list of modality names, got {mods!r}")
        if not clients and not mods:
            raise ConfigError(f"{where}: select clients with 'for_clients = [...]' or 'for_modalities = [...]'")
        base = dict(model_table)
        name = entry.pop("name", base.pop("name", DEFAULTS["model"]["name"]))
        if name != model_table.get("name", DEFAULTS["model"]["name"]):
            base = {}  # another model: the [model] keys are not its keys
        base.pop("name", None)
        values = {**base, **entry}
        try:
            params = models.params(name, values)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        out.append(ClientModel(list(clients), list(mods), Component(name, values, params)))
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    return resolve(apply_overrides(load_raw(path), overrides or []))
