"""Typed config sections of mmfl's trust mechanisms (issue 15): ``[privacy]`` (what may leave a
client), ``[attack]`` (simulated malicious clients), ``[dp]`` (differential privacy) and
``[secure_aggregation]`` (Flower's SecAgg+). Each validates itself in ``__post_init__`` with a
one-line :class:`~mmfl.errors.ConfigError` naming the field; :mod:`mmfl.schema` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmfl.errors import ConfigError

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


DPMode = Literal["central", "local", "sample", "rows"]


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
                "(per-sample gradient clipping and noise, Opacus); rows: each row's vector a client sends (shared "
                "embeddings, cut activations) clipped and noised (docs/dp.md)"})
    clip_norm: float = field(default=1.0, metadata={
        "help": "C: the L2 norm every update w_k - w^t (central, local) or every sample's gradient (sample) is "
                "clipped to"})
    noise_multiplier: float = field(default=1.0, metadata={
        "help": "z: the Gaussian noise std is z * C (on the sum: central; on each update: local; on each step's "
                "sum of clipped gradients: sample); 0: no noise"})
    delta: float = field(default=1e-5, metadata={"help": "the delta at which epsilon is reported, in (0, 1)"})

    def __post_init__(self):
        import math

        if self.mode not in ("central", "local", "sample", "rows"):
            raise ConfigError(f"dp.mode: must be \"central\", \"local\", \"sample\" or \"rows\", got {self.mode!r}")
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
