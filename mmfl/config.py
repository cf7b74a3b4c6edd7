"""Typed experiment configuration: TOML file + ``--set key=value`` overrides.

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

Component tables are validated against the registered parameter dataclass of
the named entry, so a misspelt key is an error naming it.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import tomli_w

from mmfl.errors import ConfigError
from mmfl.registry import build_params

COMPONENTS = ("data", "partition", "modalities", "model", "algorithm")


@dataclass
class TrainConfig:
    """Local training settings (MOON's code defaults)."""

    local_epochs: int = field(default=10, metadata={"help": "epochs of local training per round"})
    batch_size: int = field(default=64, metadata={"help": "mini-batch size"})
    lr: float = field(default=0.01, metadata={"help": "learning rate"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum"})
    weight_decay: float = field(default=1e-5, metadata={"help": "L2 weight decay"})
    optimizer: Literal["sgd", "adam"] = field(default="sgd", metadata={"help": "sgd or adam"})
    lr_schedule: Literal["constant", "cosine"] = field(default="constant", metadata={
        "help": "learning rate over rounds: constant, or cosine (lr_min + (lr - lr_min) (1 + cos(pi r / T)) / 2 "
                "in round r, as torch's CosineAnnealingLR stepped once per round)"})
    lr_min: float = field(default=0.0, metadata={"help": "cosine schedule: the learning rate it decays to"})
    lr_rounds: int = field(default=0, metadata={
        "help": "cosine schedule: its period T in rounds (0 = the run's rounds)"})

    def __post_init__(self):
        if self.local_epochs < 1:
            raise ConfigError(f"train.local_epochs: must be >= 1, got {self.local_epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size: must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ConfigError(f"train.lr: must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"train.momentum: must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"train.weight_decay: must be >= 0, got {self.weight_decay}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(f"train.lr_schedule: must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if not 0 <= self.lr_min <= self.lr:
            raise ConfigError(f"train.lr_min: must be in [0, train.lr = {self.lr}], got {self.lr_min}")
        if isinstance(self.lr_rounds, bool) or not isinstance(self.lr_rounds, int) or self.lr_rounds < 0:
            raise ConfigError(f"train.lr_rounds: must be an integer >= 0, got {self.lr_rounds!r}")


@dataclass
class RunConfig:
    """Top-level run settings."""

    name: str = field(default="experiment", metadata={"help": "run folder name under output_dir"})
    seed: int = field(default=0, metadata={"help": "seed of model init, sampling and local shuffling"})
    rounds: int = field(default=10, metadata={"help": "communication rounds"})
    sample_fraction: float = field(default=1.0, metadata={"help": "fraction of clients sampled per round, in (0, 1]"})
    clients_per_round: int = field(default=0, metadata={"help": "clients per round (overrides sample_fraction if > 0)"})
    eval_every: int = field(default=1, metadata={"help": "evaluate every N rounds (and at the last round)"})
    output_dir: str = field(default="runs", metadata={"help": "parent folder of run folders"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0 = torch's default)"})
    on_nonfinite: Literal["fail", "drop"] = field(
        default="fail", metadata={"help": "a client reply with NaN/inf: fail the run, or drop that client"})
    keep_checkpoints: int = field(default=1, metadata={"help": "how many round checkpoints to keep (>= 1)"})
    reply_timeout: float = field(
        default=600.0, metadata={"help": "Flower: seconds to wait for the replies of one send (> 0)"})
    on_missing_reply: Literal["fail", "drop"] = field(
        default="drop", metadata={"help": "Flower: a client whose SuperNode did not reply in time or died: "
                                          "fail the run, or drop that client"})
    batch_clients: bool = field(
        default=False, metadata={"help": "train a round's clients together (vmap over stacked parameters) "
                                         "where the algorithm and model allow it; equal to sequential "
                                         "training within float tolerance, not bit for bit"})
    state_store: Literal["auto", "memory", "disk"] = field(
        default="auto", metadata={"help": "where persistent client state lives between rounds: memory, "
                                          "disk (memory-mapped files in the run folder), or auto "
                                          "(disk from 1,000 clients on)"})

    def __post_init__(self):
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"name: must be a plain folder name, got {self.name!r}")
        if self.rounds < 1:
            raise ConfigError(f"rounds: must be >= 1, got {self.rounds}")
        if not 0 < self.sample_fraction <= 1:
            raise ConfigError(f"sample_fraction: must be in (0, 1], got {self.sample_fraction}")
        if self.clients_per_round < 0:
            raise ConfigError(f"clients_per_round: must be >= 0, got {self.clients_per_round}")
        if self.eval_every < 1:
            raise ConfigError(f"eval_every: must be >= 1, got {self.eval_every}")
        if self.threads < 0:
            raise ConfigError(f"threads: must be >= 0, got {self.threads}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints: must be >= 1, got {self.keep_checkpoints}")
        if not self.reply_timeout > 0:
            raise ConfigError(f"reply_timeout: must be > 0, got {self.reply_timeout}")


Rule = Literal["shareable", "private"]
RULES = ("shareable", "private")


@dataclass
class PrivacyConfig:
    """The ``[privacy]`` table: which modalities' raw data and whether labels may leave a
    client. Absent table: no rules, nothing checked. Every client reply is checked against
    the rules before it leaves the client (:mod:`mmfl.engine.privacy`); modality names are
    checked against the data set(s) when the transport is built (``mmfl.engine.privacy.make_checker``)."""

    modalities: dict[str, Rule] = field(default_factory=dict, metadata={
        "help": "per modality, \"shareable\" (its raw data may leave a client) or \"private\", "
                "e.g. {audio = \"private\", image = \"shareable\"}"})
    labels: Rule = field(default="private", metadata={"help": "\"private\": no reply may carry the client's labels"})
    default: Rule = field(default="private", metadata={"help": "the rule of modalities not named in 'modalities'"})

    def __post_init__(self):
        for m, rule in self.modalities.items():
            if rule not in RULES:
                raise ConfigError(f"privacy.modalities.{m}: must be \"shareable\" or \"private\", got {rule!r}")

    def rule_of(self, modality: str) -> tuple[str, str]:
        """``(rule, the config key that sets it)`` for ``modality``."""
        if modality in self.modalities:
            return self.modalities[modality], f"privacy.modalities.{modality}"
        return self.default, "privacy.default"

    def check_names(self, modalities) -> None:
        """ConfigError for a rule naming a modality the data set(s) do not have."""
        known = list(dict.fromkeys(modalities))
        for m in self.modalities:
            if m not in known:
                raise ConfigError(f"privacy.modalities.{m}: unknown modality {m!r} "
                                  f"(data set has: {', '.join(known)})")


@dataclass
class SystemConfig:
    """The ``[system]`` table: the wireless system model that turns each round's bytes and
    FLOPs into simulated latency (:mod:`mmfl.engine.system`, docs/system.md). Absent table:
    no system model, no ``sim_*`` metrics. Geometry, path loss and carrier frequency are the
    paper's (Yin, Chen, Tao, sec. IV-A); the paper gives no values for the others, so their
    defaults are common assumptions (docs/system.md says which)."""

    name: Literal["wireless"] = field(default="wireless", metadata={"help": "the system model (only 'wireless')"})
    diameter_m: float = field(default=100.0, metadata={
        "help": "devices are placed uniformly in a disc of this diameter around the base station (m)"})
    min_distance_m: float = field(default=1.0, metadata={
        "help": "closest a device may be to the base station (m); the path-loss formula needs d > 0"})
    carrier_ghz: float = field(default=2.6, metadata={"help": "carrier frequency f_c (GHz), in the path loss"})
    fading: Literal["rayleigh", "none"] = field(default="rayleigh", metadata={
        "help": "rayleigh: the channel amplitude is Rayleigh with mean 10^(-PL/20), redrawn every round; "
                "none: the amplitude is that mean"})
    bandwidth_hz: float = field(default=1e6, metadata={"help": "bandwidth B of each device's channel (Hz)"})
    bs_power_dbm: float = field(default=30.0, metadata={"help": "base-station transmit power p^ (dBm), download"})
    device_power_dbm: float = field(default=23.0, metadata={"help": "device transmit power p_k (dBm), upload"})
    noise_dbm_per_hz: float = field(default=-174.0, metadata={"help": "AWGN power spectral density N_0 (dBm/Hz)"})
    cycles_per_s: float | list[float] = field(default=1e9, metadata={
        "help": "device computing frequency f_k (cycles/s): a number, or [min, max] drawn uniformly per device"})
    flops_per_cycle: float = field(default=16.0, metadata={"help": "FLOPs per cycle e_k of every device"})
    train_flops_factor: float = field(default=3.0, metadata={
        "help": "FLOPs of one training step per FLOP of the forward pass (forward + backward ~ 3x forward)"})

    def __post_init__(self):
        import math

        for key in ("diameter_m", "min_distance_m", "carrier_ghz", "bandwidth_hz", "flops_per_cycle",
                    "train_flops_factor"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"system.{key}: must be a positive number, got {v}")
        if self.min_distance_m > self.diameter_m / 2:
            raise ConfigError(f"system.min_distance_m: must be at most the radius ({self.diameter_m / 2} m), "
                              f"got {self.min_distance_m}")
        for key in ("bs_power_dbm", "device_power_dbm", "noise_dbm_per_hz"):
            if not math.isfinite(getattr(self, key)):
                raise ConfigError(f"system.{key}: must be a finite number (dBm), got {getattr(self, key)}")
        f = self.cycles_per_s
        if isinstance(f, list):
            if len(f) != 2 or not all(math.isfinite(v) and v > 0 for v in f) or f[0] > f[1]:
                raise ConfigError(f"system.cycles_per_s: must be a positive number or [min, max] with "
                                  f"0 < min <= max, got {f}")
        elif not (math.isfinite(f) and f > 0):
            raise ConfigError(f"system.cycles_per_s: must be a positive number or [min, max], got {f}")


@dataclass
class Component:
    """A ``[data]``/``[partition]``/``[model]``/``[algorithm]`` table: a name and raw values."""

    name: str
    values: dict[str, Any]
    params: Any = None  # the validated params dataclass


@dataclass
class ClientModel:
    """A ``[[client_models]]`` entry: which clients build another model than ``[model]``.

    ``for_clients`` (ids) or ``for_modalities`` (the exact set a client holds) selects
    the clients; ``model`` is the resolved model table (``[model]`` with this entry's
    keys on top, so a group can change only ``feat_dim``, or name another model).
    """

    clients: list[int]
    modalities: list[str]
    model: Component

    def matches(self, cid: int, holds: tuple[str, ...]) -> bool:
        if self.clients and cid not in self.clients:
            return False
        return not self.modalities or sorted(self.modalities) == sorted(holds)


@dataclass
class ClientData:
    """A ``[[client_data]]`` entry: more clients, whose private data comes from another data
    set (``data``) split by ``partition`` (CreamFL's image-only and text-only clients). They
    come after the clients of ``[data]``, hold all of their data set's modalities, and
    evaluate local models on its test split; the server keeps ``[data]``'s test set."""

    data: Component
    partition: Component


@dataclass
class ExperimentConfig:
    run: RunConfig
    train: TrainConfig
    data: Component
    partition: Component
    modalities: Component
    model: Component
    algorithm: Component
    client_models: list[ClientModel] = field(default_factory=list)
    client_data: list[ClientData] = field(default_factory=list)
    privacy: PrivacyConfig | None = None  # [privacy]; None: no rules (nothing checked)
    system: SystemConfig | None = None  # [system]; None: no system model (no simulated latency)

    def to_dict(self) -> dict:
        """The resolved config (every default filled in), as TOML-able tables."""
        out: dict[str, Any] = asdict(self.run)
        for kind in COMPONENTS:
            comp: Component = getattr(self, kind)
            table = {"name": comp.name}
            if comp.params is not None:
                table.update(asdict(comp.params))
            out[kind] = table
        out["train"] = asdict(self.train)
        if self.client_models:
            out["client_models"] = [
                {**({"for_clients": g.clients} if g.clients else {}),
                 **({"for_modalities": g.modalities} if g.modalities else {}),
                 "name": g.model.name, **(asdict(g.model.params) if g.model.params is not None else {})}
                for g in self.client_models]
        if self.client_data:
            out["client_data"] = [
                {kind: {"name": getattr(e, kind).name, **asdict(getattr(e, kind).params)}
                 for kind in ("data", "partition")} for e in self.client_data]
        if self.privacy is not None:
            out["privacy"] = asdict(self.privacy)
        if self.system is not None:
            out["system"] = asdict(self.system)
        return _drop_none(out)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name


def _drop_none(d):
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


DEFAULTS: dict[str, Any] = {
    "data": {"name": "mfeat"},
    "partition": {"name": "dirichlet"},
    "modalities": {"name": "all"},
    "model": {"name": "mlp"},
    "algorithm": {"name": "fedavg"},
    "train": {},
}


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"algorithm.mu=5"`` -> (["algorithm", "mu"], 5). Values are TOML literals,
    falling back to a plain string (``data.name=mfeat``)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def load_raw(path: str | Path | None) -> dict:
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    raw = copy.deepcopy(raw)
    for item in overrides:
        keys, value = parse_override(item)
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a table")
        node[keys[-1]] = value
    return raw


def apply_case(raw: dict) -> dict:
    """Expand a top-level ``case = "A".."D"`` (FedCMI's settings, :data:`mmfl.data.modality.CASES`)
    into the ``[partition]`` and ``[modalities]`` tables. A table that names a different
    entry than the case is an error; other keys in the tables are kept."""
    if "case" not in raw:
        return raw
    from mmfl.data.modality import CASES

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
    from mmfl.algorithms import ALGORITHMS  # noqa: WPS433 (registries import their modules)
    from mmfl.data import DATASETS, PARTITIONERS
    from mmfl.data.modality import MODALITY_ASSIGNERS
    from mmfl.models import MODELS

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
    run_fields = {f.name for f in fields(RunConfig)}
    for key in raw:
        if key not in run_fields:
            known = sorted(run_fields | set(tables) | {"case", "client_data", "client_models", "privacy", "system"})
            raise ConfigError(f"{key}: unknown config key (known: {', '.join(known)})")
    run = build_params("", "settings", RunConfig, raw)
    train = build_params("train", "settings", TrainConfig, tables["train"])
    comps = {}
    for kind in COMPONENTS:
        table = dict(tables[kind])
        name = table.pop("name", DEFAULTS[kind]["name"])
        if not isinstance(name, str):
            raise ConfigError(f"{kind}.name: expected a string, got {name!r}")
        params = registries[kind].params(name, table)
        comps[kind] = Component(name, table, params)
    groups = resolve_client_models(groups_raw, tables["model"], MODELS)
    sources = resolve_client_data(sources_raw, {"data": DATASETS, "partition": PARTITIONERS})
    privacy = resolve_privacy(privacy_raw)
    system = resolve_system(system_raw)
    return ExperimentConfig(run=run, train=train, **comps, client_models=groups, client_data=sources,
                            privacy=privacy, system=system)


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
