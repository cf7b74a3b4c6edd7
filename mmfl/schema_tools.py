"""Typed config sections of mmfl's tool integrations: ``[tracking]`` (experiment tracking with
TensorBoard, MLflow or W&B; :mod:`mmfl.engine.tracking`, docs/tracking.md). Each validates itself
in ``__post_init__`` with a one-line :class:`~mmfl.errors.ConfigError` naming the field;
:mod:`mmfl.schema` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmfl.errors import ConfigError

TRACKING_BACKENDS = ("tensorboard", "mlflow", "wandb")


def _names(value, where: str, known: tuple[str, ...], what: str) -> list[str]:
    """``value`` (a name or a list of names) checked as a non-empty list of distinct ``known``
    names; a one-line :class:`ConfigError` naming ``where`` otherwise."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a non-empty list of {', '.join(known)}, got {value!r}")
    for v in value:
        if v not in known:
            raise ConfigError(f"{where}: unknown {what} {v!r} (known: {', '.join(known)})")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: a {what} is named twice in {value}")
    return value


@dataclass
class TrackingConfig:
    """The ``[tracking]`` table: send every metrics row (the rows of ``metrics.jsonl``, step =
    round), the resolved config and the final summary to offline experiment trackers. Absent
    table: no tracking (``mmfl run --track tensorboard`` adds it from the command line). Nothing
    here changes a run's results; on resume the table may be added, changed or removed."""

    backends: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={
        "help": "any of \"tensorboard\" (event files), \"mlflow\" (local file store), \"wandb\" (offline "
                "run); needs pip install 'mmfl[tracking]'"})
    dir: str = field(default="", metadata={
        "help": "where the trackers write: \"\" = inside the run folder (<run>/tb, <run>/mlruns, <run>/wandb); "
                "a folder shared by runs gets <dir>/tb/<run_name>, <dir>/mlruns, <dir>/wandb"})
    project: str = field(default="mmfl", metadata={"help": "MLflow experiment name / W&B project"})
    run_name: str = field(default="", metadata={"help": "the run's name in the trackers (\"\" = the run's name)"})

    def __post_init__(self):
        self.backends = _names(self.backends, "tracking.backends", TRACKING_BACKENDS, "back-end")
        for key in ("dir", "project", "run_name"):
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"tracking.{key}: must be a string, got {getattr(self, key)!r}")
        if not self.project:
            raise ConfigError("tracking.project: must not be empty")
        if "/" in self.run_name:
            raise ConfigError(f"tracking.run_name: must be a plain name without '/', got {self.run_name!r}")


REFERENCE_METHODS = ("centralized", "local", "logistic_regression", "random_forest")


@dataclass
class ReferenceConfig:
    """The ``[reference]`` table: after the run, also train references on the same split and
    features (:mod:`mmfl.reference`, docs/reference.md): centralized training of the same model,
    local-only training, scikit-learn logistic regression and a random forest on the pooled
    training rows. They use pooled data: **simulation only** (``mmfl flower`` refuses the table).
    Absent table: no references (``mmfl run --reference`` adds it). Nothing here changes the
    federated run's results; on resume the table may be added, changed or removed."""

    enabled: bool = field(default=True, metadata={"help": "run the references (false: keep the table, run none)"})
    methods: list[str] = field(default_factory=lambda: list(REFERENCE_METHODS), metadata={
        "help": "any of \"centralized\" (for retrieval: the server alone), \"local\", \"logistic_regression\", "
                "\"random_forest\""})
    sklearn_max_rows: int = field(default=20000, metadata={
        "help": "scikit-learn references train on at most this many pooled rows (a seeded subset beyond it)"})
    forest_max_features: int = field(default=4096, metadata={
        "help": "the random forest runs only where the flattened features are at most this many"})
    forest_trees: int = field(default=100, metadata={"help": "trees of the random forest"})

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"reference.enabled: must be true or false, got {self.enabled!r}")
        self.methods = _names(self.methods, "reference.methods", REFERENCE_METHODS, "method")
        for key in ("sklearn_max_rows", "forest_max_features", "forest_trees"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"reference.{key}: must be an integer >= 1, got {v!r}")
