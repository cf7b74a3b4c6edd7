"""The typed schema of an experiment config: run settings, local training, privacy rules,
the wireless system model, and the resolved :class:`ExperimentConfig` that the runtime and
the algorithms read. No registry lookups here (those are :mod:`mmfl.config`'s resolution,
a layer above the runtime): every layer may import this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from mmfl.errors import ConfigError

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
    personal_eval: bool = field(
        default=False, metadata={"help": "also evaluate every client's model on its own test rows "
                                         "(personalized evaluation, metrics under personal/) for an "
                                         "algorithm that does not already"})
    output_dir: str = field(default="runs", metadata={"help": "parent folder of run folders"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0 = torch's default)"})
    on_nonfinite: Literal["fail", "drop"] = field(
        default="fail", metadata={"help": "a client reply with NaN/inf: fail the run, or drop that client"})
    on_bad_reply: Literal["drop", "fail"] = field(
        default="drop", metadata={"help": "a client reply that does not fit what the server expects (keys, "
                                          "shapes, dtypes, num_examples; mmfl.core.replies): drop it with a "
                                          "logged reason (counted in replies_rejected), or fail the run"})
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
        if self.stream_aggregation not in ("auto", "on", "off"):
            raise ConfigError(f"stream_aggregation: must be 'auto', 'on' or 'off', got {self.stream_aggregation!r}")
        if self.on_bad_reply not in ("drop", "fail"):
            raise ConfigError(f"on_bad_reply: must be 'drop' or 'fail', got {self.on_bad_reply!r}")


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


REPRESENTATION_ATTACKS = ("shuffle_reps", "random_reps")
ATTACK_KINDS = ("sign_flip", "scale", "gaussian", "label_flip", "constant", "inflate_examples",
                *REPRESENTATION_ATTACKS)


@dataclass
class AttackConfig:
    """The ``[attack]`` table: a seeded fraction of malicious clients and what they do
    (:mod:`mmfl.engine.attack` gives each kind's formula). Absent table: no attack."""

    kind: str = field(default="sign_flip", metadata={
        "help": "sign_flip, scale, gaussian, constant (reply changed after training), label_flip (labels "
                "y -> C-1-y before training), inflate_examples (num_examples set to 'examples'), "
                "shuffle_reps, random_reps (representation exchange, CreamFL's family)"})
    fraction: float = field(default=0.1, metadata={
        "help": "fraction of the clients that are malicious, in [0, 1] (round(fraction * clients) of them, "
                "drawn once from the run seed)"})
    scale: float = field(default=10.0, metadata={"help": "sign_flip / scale: the factor on the update"})
    noise_std: float = field(default=1.0, metadata={"help": "gaussian: std of the noise that replaces the update"})
    target: float = field(default=1.0, metadata={"help": "constant: the value of every entry of the update"})
    examples: int = field(default=1_000_000_000, metadata={"help": "inflate_examples: the num_examples sent"})

    def __post_init__(self):
        import math

        if self.kind not in ATTACK_KINDS:
            raise ConfigError(f"attack.kind: must be one of {', '.join(ATTACK_KINDS)}, got {self.kind!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) \
                or not 0 <= self.fraction <= 1:
            raise ConfigError(f"attack.fraction: must be in [0, 1], got {self.fraction!r}")
        for key in ("scale", "target"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"attack.{key}: must be a finite number, got {v!r}")
        if isinstance(self.noise_std, bool) or not isinstance(self.noise_std, (int, float)) \
                or not (math.isfinite(self.noise_std) and self.noise_std > 0):
            raise ConfigError(f"attack.noise_std: must be a positive number, got {self.noise_std!r}")
        if isinstance(self.examples, float) and self.examples.is_integer():
            self.examples = int(self.examples)  # 1e9 in TOML is a float
        if isinstance(self.examples, bool) or not isinstance(self.examples, int):
            raise ConfigError(f"attack.examples: must be an integer, got {self.examples!r}")


DPMode = Literal["central", "local", "sample"]


@dataclass
class DPConfig:
    """The ``[dp]`` table: differential privacy for the weight-averaging algorithms (docs/dp.md).
    Absent table: no DP. Client level: each client's update ``w_k - w^t`` is clipped to L2 norm
    ``clip_norm``; Gaussian noise of std ``noise_multiplier * clip_norm`` is added to the sum of the
    clipped updates on the server (``central``, DP-FedAvg of McMahan et al. 2018) or to each
    clipped update before it leaves its client (``local``). Sample level (``sample``): DP-SGD in
    each client's local training (Abadi et al. 2016, through Opacus), each sample's gradient
    clipped to ``clip_norm`` and noise of std ``noise_multiplier * clip_norm`` added to their sum.
    Epsilon at ``delta`` is reported per round (``dp/epsilon`` in metrics.jsonl) by Opacus's RDP
    accountant."""

    mode: DPMode = field(default="central", metadata={
        "help": "central: the server clips every update and adds noise to their sum; local: each client "
                "clips its own update and adds noise to it before sending; sample: DP-SGD in local training "
                "(per-sample gradient clipping and noise, Opacus)"})
    clip_norm: float = field(default=1.0, metadata={
        "help": "C: the L2 norm every update w_k - w^t (central, local) or every sample's gradient (sample) is "
                "clipped to"})
    noise_multiplier: float = field(default=1.0, metadata={
        "help": "z: the Gaussian noise std is z * C (on the sum: central; on each update: local; on each step's "
                "sum of clipped gradients: sample); 0: no noise"})
    delta: float = field(default=1e-5, metadata={"help": "the delta at which epsilon is reported, in (0, 1)"})

    def __post_init__(self):
        import math

        if self.mode not in ("central", "local", "sample"):
            raise ConfigError(f"dp.mode: must be \"central\", \"local\" or \"sample\", got {self.mode!r}")
        if isinstance(self.clip_norm, bool) or not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ConfigError(f"dp.clip_norm: must be a positive number, got {self.clip_norm}")
        if isinstance(self.noise_multiplier, bool) or not (math.isfinite(self.noise_multiplier)
                                                           and self.noise_multiplier >= 0):
            raise ConfigError(f"dp.noise_multiplier: must be a number >= 0, got {self.noise_multiplier}")
        if isinstance(self.delta, bool) or not (0 < self.delta < 1):
            raise ConfigError(f"dp.delta: must be in (0, 1), got {self.delta}")


SECAGG_PROTOCOLS = ("secaggplus",)


@dataclass
class SecureAggregationConfig:
    """The ``[secure_aggregation]`` table: the train round's model sum goes through Flower's
    SecAgg+ (``flwr.client.mod.secaggplus_mod`` / ``flwr.server.workflow.SecAggPlusWorkflow``;
    docs/flower.md, "Secure aggregation"), so the server learns only the sum of the
    clients' weighted, quantized updates. Flower runs only. Absent table: off. The
    parameters keep Flower's names and meaning."""

    protocol: str = field(default="secaggplus", metadata={"help": "secaggplus (Flower's SecAgg+)"})
    num_shares: int | float = field(default=1.0, metadata={
        "help": "shares each SuperNode's secrets are split into: an integer > 2, or a fraction in (0, 1] of "
                "the round's SuperNodes (1.0: every node is every node's neighbour, i.e. SecAgg)"})
    reconstruction_threshold: int | float = field(default=0.5, metadata={
        "help": "shares needed to reconstruct a secret: an integer >= 2 (< num_shares when both are integers), "
                "or a fraction in (0, 1] of num_shares (at least 2)"})
    clipping_range: float = field(default=8.0, metadata={
        "help": "each weighted update entry is clipped to [-clipping_range, clipping_range] before quantization "
                "(mmfl refuses a reply that would be clipped)"})
    quantization_range: int = field(default=4194304, metadata={
        "help": "entries are quantized to integers in [0, quantization_range] (2**22); the aggregate's error "
                "per entry is below 3 * nodes * clipping_range / (quantization_range * total weight)"})
    modulus_range: int = field(default=4294967296, metadata={
        "help": "masks are drawn from [0, modulus_range): a power of 2, > nodes * quantization_range, <= 2**32"})
    max_weight: float = field(default=0.0, metadata={
        "help": "the largest num_examples a SuperNode may send (its clients' total); 0: the largest "
                "SuperNode's training data, which the server knows"})

    def __post_init__(self):
        import math

        def number(v):
            return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

        if self.protocol not in SECAGG_PROTOCOLS:
            raise ConfigError(f"secure_aggregation.protocol: must be one of {', '.join(SECAGG_PROTOCOLS)}, "
                              f"got {self.protocol!r}")
        ns, t = self.num_shares, self.reconstruction_threshold
        if ns == 1 and isinstance(ns, int):
            self.num_shares = ns = 1.0  # Flower reads the integer 1 as the fraction 1.0
        if not number(ns) or (isinstance(ns, int) and ns <= 2) or (isinstance(ns, float) and not 0 < ns <= 1):
            raise ConfigError(f"secure_aggregation.num_shares: must be an integer > 2 or a fraction in (0, 1], "
                              f"got {ns!r}")
        if t == 1 and isinstance(t, int):
            self.reconstruction_threshold = t = 1.0
        if not number(t) or (isinstance(t, int) and t < 2) or (isinstance(t, float) and not 0 < t <= 1):
            raise ConfigError(f"secure_aggregation.reconstruction_threshold: must be an integer >= 2 or a "
                              f"fraction in (0, 1], got {t!r}")
        if isinstance(t, int) and isinstance(ns, int) and t >= ns:
            raise ConfigError(f"secure_aggregation.reconstruction_threshold: must be < num_shares = {ns}, got {t}")
        if not number(self.clipping_range) or not self.clipping_range > 0:
            raise ConfigError(f"secure_aggregation.clipping_range: must be a positive number, "
                              f"got {self.clipping_range!r}")
        q, m = self.quantization_range, self.modulus_range
        if isinstance(q, bool) or not isinstance(q, int) or q < 2:
            raise ConfigError(f"secure_aggregation.quantization_range: must be an integer >= 2, got {q!r}")
        if isinstance(m, bool) or not isinstance(m, int) or m <= q or m > 2 ** 32 or m & (m - 1):
            raise ConfigError(f"secure_aggregation.modulus_range: must be a power of 2 greater than "
                              f"quantization_range = {q} and at most 2**32, got {m!r}")
        if not number(self.max_weight) or self.max_weight < 0:
            raise ConfigError(f"secure_aggregation.max_weight: must be a number >= 0 (0: automatic), "
                              f"got {self.max_weight!r}")


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
