"""The round as a pipeline: the declared, ordered list of stages that
:class:`mmfl.engine.runner.Experiment` walks each round (docs/architecture.md, "The round loop").

Each entry is a :class:`~mmfl.engine.stages.base.Stage` class in its own module under
``mmfl/engine/stages/``; its place in the list is its place in the round, and the order in which
its keys appear in ``metrics.jsonl``. Adding a stage is one new module and one line here (or,
for one run, ``Experiment(cfg, stages=with_stage(STAGES, MyStage, before=Metrics))``).
"""

from __future__ import annotations

from typing import Sequence

from mmfl.engine.stages.attack_record import AttackRecord
from mmfl.engine.stages.base import Round, Stage
from mmfl.engine.stages.checks import Finite, Learning
from mmfl.engine.stages.clock import TrainTime, WallTime
from mmfl.engine.stages.dp_epsilon import DPEpsilon
from mmfl.engine.stages.evaluate import Evaluate
from mmfl.engine.stages.latency import Latency
from mmfl.engine.stages.progress_bar import Progress
from mmfl.engine.stages.record import Checkpoint, Metrics
from mmfl.engine.stages.reply_log import Dropped, TrainBytes, TrainReplies
from mmfl.engine.stages.track import Track
from mmfl.engine.stages.train import Train

__all__ = ["STAGES", "Round", "Stage", "build_stages", "with_stage"]

STAGES: tuple[type[Stage], ...] = (
    Train,         # server.round over the transport; "round", "clients", the server's metrics, batching
    DPEpsilon,     # [dp]: dp/epsilon, dp/delta
    TrainReplies,  # the training bytes, dropped and rejected so far (before evaluation resets the log)
    TrainTime,     # train_time_s
    Evaluate,      # every eval_every rounds and the last: accuracy, ..., eval_bytes_*
    TrainBytes,    # bytes_up, bytes_down, per route and client
    Latency,       # [system]: sim_time_s, sim_time_total_s, ...
    Dropped,       # dropped, replies_rejected, rejected (training and evaluation)
    AttackRecord,  # [attack]: attack/kind, attack/clients
    WallTime,      # wall_time_s
    Finite,        # a non-finite accuracy or loss stops the run
    Learning,      # the note when train_loss sits at ln K or rises
    Metrics,       # the row appended to metrics.jsonl (fsynced)
    Track,         # [tracking]: the row to TensorBoard, MLflow, W&B
    Checkpoint,    # checkpoints/round_NNNNN every checkpoint_every rounds and after the last
    Progress,      # the progress bars (begin: before every stage; round: after them)
)


def build_stages(exp, stages: Sequence[type[Stage]]) -> list[Stage]:
    """The stages that apply to ``exp``'s run, in order (a stage's ``make`` may refuse the config)."""
    built = (cls.make(exp) for cls in stages)
    return [s for s in built if s is not None]


def with_stage(stages: Sequence[type[Stage]], stage: type[Stage], *, before: type[Stage] | None = None,
               after: type[Stage] | None = None) -> tuple[type[Stage], ...]:
    """``stages`` with ``stage`` inserted before ``before`` or after ``after`` (one of them)."""
    if (before is None) == (after is None):
        raise ValueError("with_stage: give exactly one of before= and after=")
    at = list(stages).index(before if before is not None else after) + (after is not None)
    return (*stages[:at], stage, *stages[at:])
