"""The typed schema of an experiment config: run settings, local training, privacy rules,
the wireless system model (the privacy, attack, DP and secure-aggregation sections:
:mod:`mmfl.schema_trust`; experiment tracking: :mod:`mmfl.schema_tools`), and the resolved :class:`ExperimentConfig` that the runtime and
the algorithms read. No registry lookups here (those are :mod:`mmfl.config`'s resolution,
a layer above the runtime): every layer may import this module.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from mmfl.errors import ConfigError
# the trust sections live in their own module; re-exported here, where the rest of mmfl imports them
from mmfl.schema_trust import (ATTACK_KINDS, REPRESENTATION_ATTACKS, RULES, SECAGG_PROTOCOLS,  # noqa: F401
                               AttackConfig, DPConfig, PrivacyConfig, Rule, SecureAggregationConfig)
from mmfl.schema_tools import TRACKING_BACKENDS, ReferenceConfig, TrackingConfig  # noqa: F401  (the tool sections, likewise)

DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"  # the run's device setting (resolved by mmfl.core.device)
COMPONENTS = ("data", "partition", "modalities", "model", "algorithm")


# upper bounds where a larger value can only be a mistake (issue 27, item 5): one line, not a
# traceback or a run that never ends
MAX_LR = 1e3  # train.lr, train.weight_decay
MAX_EPOCHS = 100_000  # train.local_epochs
MAX_ROUNDS = 10_000_000  # rounds
MAX_THREADS = 4096  # threads


@dataclass
class TrainConfig:
    """Local training settings. Adam with lr 1e-3 by default: measured on seven data sets mmfl had never
    seen, it learns where MOON's code defaults (SGD, lr 0.01, momentum 0.9, which every packaged config
    pins) sat at chance (docs/recipe.md). Config resolution adds ``lr_schedule = "cosine"`` to a
    ``[train]`` that names neither optimizer nor lr (mmfl.config.with_recipe_schedule)."""

    local_epochs: int = field(default=10, metadata={"help": "epochs of local training per round"})
    batch_size: int = field(default=64, metadata={"help": "mini-batch size"})
    lr: float = field(default=1e-3, metadata={"help": "learning rate (1e-3 suits the default adam; SGD "
                                                   "configs usually want 0.01-0.1)"})
    momentum: float = field(default=0.9, metadata={"help": "SGD momentum (adam ignores it)"})
    weight_decay: float = field(default=1e-5, metadata={"help": "L2 weight decay"})
    optimizer: Literal["sgd", "adam"] = field(default="adam", metadata={
        "help": "adam or sgd (the default before issue 25 was sgd, lr 0.01, momentum 0.9)"})
    lr_schedule: Literal["constant", "cosine"] = field(default="constant", metadata={
        "help": "learning rate over rounds: constant, or cosine (lr_min + (lr - lr_min) (1 + cos(pi r / T)) / 2 "
                "in round r, as torch's CosineAnnealingLR stepped once per round); cosine where [train] names "
                "neither optimizer nor lr (mmfl.config.with_recipe_schedule, docs/recipe.md)"})
    lr_min: float = field(default=0.0, metadata={"help": "cosine schedule: the learning rate it decays to"})
    lr_rounds: int = field(default=0, metadata={
        "help": "cosine schedule: its period T in rounds (0 = the run's rounds)"})

    def __post_init__(self):
        if not 1 <= self.local_epochs <= MAX_EPOCHS:
            raise ConfigError(f"train.local_epochs: must be in [1, {MAX_EPOCHS}], got {self.local_epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size: must be >= 1, got {self.batch_size}")
        if not 0 < self.lr <= MAX_LR:  # above: a typo (1e300 overflows float32 in the optimizer step)
            raise ConfigError(f"train.lr: must be in (0, {MAX_LR:g}], got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"train.momentum: must be in [0, 1), got {self.momentum}")
        if not 0 <= self.weight_decay <= MAX_LR:
            raise ConfigError(f"train.weight_decay: must be in [0, {MAX_LR:g}], got {self.weight_decay}")
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
    personal_eval: bool = field(
        default=False, metadata={"help": "also evaluate every client's model on its own test rows "
                                         "(personalized evaluation, metrics under personal/) for an "
                                         "algorithm that does not already"})
    output_dir: str = field(default="runs", metadata={"help": "parent folder of run folders"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0 = torch's default)"})
    device: str = field(default="auto", metadata={
        "help": "where models, optimizer state, data and every tensor of the run live: auto (cuda if "
                "available, else mps, else cpu), cpu, cuda, cuda:N or mps; checkpoints are device-independent"})
    precision: Literal["fp32", "bf16"] = field(default="fp32", metadata={
        "help": "fp32, or bf16 (autocast: matmuls and convolutions in bfloat16, weights and optimizer "
                "state in fp32; messages stay fp32)"})
    gpus_per_client: float = field(default=0.0, metadata={
        "help": "Flower simulation (Ray): GPUs per ClientApp actor (e.g. 0.1: ten actors share a GPU); "
                "0 = none"})
    checkpoint_every: int = field(default=1, metadata={
        "help": "write a checkpoint every N rounds (and always after the last round); resume restarts from "
                "the newest one"})
    on_nonfinite: Literal["fail", "drop"] = field(
        default="fail", metadata={"help": "a client reply with NaN/inf: fail the run, or drop that client"})
    on_bad_reply: Literal["drop", "fail"] = field(
        default="drop", metadata={"help": "a client reply that does not fit what the server expects (keys, "
                                          "shapes, dtypes, num_examples; mmfl.core.replies): drop it with a "
                                          "logged reason (counted in replies_rejected), or fail the run"})
    on_no_valid_reply: Literal["fail", "skip"] = field(
        default="fail", metadata={"help": "a round in which replies came and every one was dropped (NaN/inf, "
                                          "invalid, missing): fail the run with one line (exit 2; resume "
                                          "from the last checkpoint), or skip the round keeping the model, "
                                          "with one line (when attackers may make up a whole cohort)"})
    keep_checkpoints: int = field(default=1, metadata={
        "help": "how many round checkpoints to keep (>= 1; >= 2 lets resume skip a damaged newest one)"})
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
    stream_aggregation: Literal["auto", "on", "off"] = field(
        default="auto", metadata={"help": "hand each client reply to the server's aggregation as it arrives and "
                                          "drop it (memory: one model plus one reply, not the cohort's replies) "
                                          "where the server's rule folds (weighted_mean, mean, iot, norm_clip, "
                                          "central DP): on, off, or auto (on from 1,000 clients per round); "
                                          "equal to the list path within float rounding (docs/performance.md)"})

    def __post_init__(self):
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"name: must be a plain folder name, got {self.name!r}")
        if not 1 <= self.rounds <= MAX_ROUNDS:  # above: a typo (2**70 would run forever)
            raise ConfigError(f"rounds: must be in [1, {MAX_ROUNDS}], got {self.rounds}")
        if not 0 < self.sample_fraction <= 1:
            raise ConfigError(f"sample_fraction: must be in (0, 1], got {self.sample_fraction}")
        if self.clients_per_round < 0:
            raise ConfigError(f"clients_per_round: must be >= 0, got {self.clients_per_round}")
        if self.eval_every < 1:
            raise ConfigError(f"eval_every: must be >= 1, got {self.eval_every}")
        if not 0 <= self.threads <= MAX_THREADS:
            raise ConfigError(f"threads: must be in [0, {MAX_THREADS}], got {self.threads}")
        if not isinstance(self.device, str) or not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ConfigError(f"device: must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"precision: must be 'fp32' or 'bf16', got {self.precision!r}")
        if not self.gpus_per_client >= 0:
            raise ConfigError(f"gpus_per_client: must be >= 0, got {self.gpus_per_client}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every: must be an integer >= 1, got {self.checkpoint_every!r}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints: must be >= 1, got {self.keep_checkpoints}")
        if not self.reply_timeout > 0:
            raise ConfigError(f"reply_timeout: must be > 0, got {self.reply_timeout}")
        if self.stream_aggregation not in ("auto", "on", "off"):
            raise ConfigError(f"stream_aggregation: must be 'auto', 'on' or 'off', got {self.stream_aggregation!r}")
        if self.on_no_valid_reply not in ("fail", "skip"):
            raise ConfigError(f"on_no_valid_reply: must be 'fail' or 'skip', got {self.on_no_valid_reply!r}")
        if self.on_bad_reply not in ("drop", "fail"):
            raise ConfigError(f"on_bad_reply: must be 'drop' or 'fail', got {self.on_bad_reply!r}")


@dataclass
class SystemConfig:
    """The ``[system]`` table: the wireless system model that turns each round's bytes and
    FLOPs into simulated latency (:mod:`mmfl.core.system`, docs/system.md). Absent table:
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
class CorruptionConfig:
    """The ``[corruption]`` table: simulated label problems of the clients' TRAIN rows, each
    client's own share, seeded from the run seed (:mod:`mmfl.data.corruption`). Absent table:
    clean labels. Missing *modalities* are ``[modalities]``' ``missing_rate`` /
    ``test_missing_rate`` / ``missing_policy``."""

    label_missing_rate: float = field(default=0.0, metadata={
        "help": "share of each client's train rows whose label is lost; such rows are dropped from "
                "training (counted in mmfl partition)"})
    label_noise: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "{ rate = r, kind = \"symmetric\" | \"pair\" }: a share r of each client's labelled train "
                "rows gets a wrong label, another class drawn uniformly (symmetric) or class c -> c + 1 mod K (pair)"})

    def __post_init__(self):
        r = self.label_missing_rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r < 1.0:
            raise ConfigError(f"corruption.label_missing_rate: must be in [0, 1), got {r!r}")
        noise = dict(self.label_noise)
        unknown = sorted(set(noise) - {"rate", "kind"})
        if unknown:
            raise ConfigError(f"corruption.label_noise.{unknown[0]}: unknown key (label_noise has rate and kind)")
        rate = noise.setdefault("rate", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
            raise ConfigError(f"corruption.label_noise.rate: must be in [0, 1), got {rate!r}")
        kind = noise.setdefault("kind", "symmetric")
        if kind not in ("symmetric", "pair"):
            raise ConfigError(f"corruption.label_noise.kind: must be 'symmetric' or 'pair', got {kind!r}")
        noise["rate"] = float(rate)
        self.label_noise = noise


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
    attack: AttackConfig | None = None  # [attack]; None: every client honest
    dp: DPConfig | None = None  # [dp]; None: no differential privacy
    secure_aggregation: SecureAggregationConfig | None = None  # [secure_aggregation]; None: plain sums (Flower)
    tracking: TrackingConfig | None = None  # [tracking]; None: no experiment tracking
    reference: ReferenceConfig | None = None  # [reference]; None: no references (mmfl.reference)
    corruption: CorruptionConfig | None = None  # [corruption]; None: clean labels

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
        if self.attack is not None:
            out["attack"] = asdict(self.attack)
        if self.dp is not None:
            out["dp"] = asdict(self.dp)
        if self.secure_aggregation is not None:
            out["secure_aggregation"] = asdict(self.secure_aggregation)
        if self.tracking is not None:
            out["tracking"] = asdict(self.tracking)
        if self.reference is not None:
            out["reference"] = asdict(self.reference)
        if self.corruption is not None:
            out["corruption"] = asdict(self.corruption)
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
