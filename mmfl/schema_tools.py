"""Typed config sections of mmfl's tool integrations: ``[tracking]`` (experiment tracking with
TensorBoard, MLflow or W&B; :mod:`mmfl.engine.tracking`, docs/tracking.md). Each validates itself
in ``__post_init__`` with a one-line :class:`~mmfl.errors.ConfigError` naming the field;
:mod:`mmfl.schema` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmfl.errors import ConfigError

TRACKING_BACKENDS = ("tensorboard", "mlflow", "wandb")


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
        if isinstance(self.backends, str):
            self.backends = [self.backends]
        if not isinstance(self.backends, list) or not self.backends:
            raise ConfigError(f"tracking.backends: must be a non-empty list of {', '.join(TRACKING_BACKENDS)}, "
                              f"got {self.backends!r}")
        for b in self.backends:
            if b not in TRACKING_BACKENDS:
                raise ConfigError(f"tracking.backends: unknown back-end {b!r} (known: {', '.join(TRACKING_BACKENDS)})")
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError(f"tracking.backends: a back-end is named twice in {self.backends}")
        for key in ("dir", "project", "run_name"):
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"tracking.{key}: must be a string, got {getattr(self, key)!r}")
        if not self.project:
            raise ConfigError("tracking.project: must not be empty")
        if "/" in self.run_name:
            raise ConfigError(f"tracking.run_name: must be a plain name without '/', got {self.run_name!r}")
