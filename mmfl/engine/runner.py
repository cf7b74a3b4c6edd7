"""The round loop: build the federation, sample, deliver, evaluate, log,
checkpoint, resume. Each round walks the declared stages of :mod:`mmfl.engine.pipeline`
(training, evaluation, the row's entries, metrics.jsonl, tracking, the checkpoint).

Run folder ``<output_dir>/<name>/``:

- ``config.toml``: the resolved config (every default filled in);
- ``metrics.jsonl``: one JSON object per round (train and test metrics,
  bytes up/down per route and per client, wall time; with ``[system]`` the simulated
  latency ``sim_*``, see :mod:`mmfl.core.system`);
- ``checkpoints/round_NNNNN/``: the state after the last round (see
  :mod:`mmfl.engine.checkpoint`);
- ``labels.json``: class label -> id, when the data set maps its labels (a manifest);
- ``summary.json`` when the run finishes (``mmfl report RUN`` draws ``accuracy.png``);
- ``.lock``: held by the process writing the folder (see :mod:`mmfl.engine.runfolder`);
- ``.mmfl-run``, ``.mmfl-files``: the marker of a folder mmfl created and the list of what the
  run wrote, all ``--overwrite`` deletes (:mod:`mmfl.engine.runfiles`).
"""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Callable, Sequence

import torch

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ServerContext, Transport
from mmfl.core.device import place_federation, resolve_device, to_device
from mmfl.core.evaluation import PERSONAL_PREFIX, EvalContext
from mmfl.core.personal import personal_test_indices
from mmfl.core.system import WirelessSystem
from mmfl.core.training import train_for_run
from mmfl.data.federation import build_federation
from mmfl.engine import checkpoint, pipeline, runfiles, runfolder
from mmfl.engine.cohort import cohort_size, sample_cohort
from mmfl.engine.runfolder import with_new_defaults  # noqa: F401  (its home before)
from mmfl.engine.dp_runtime import LocalDP, check_dpsgd_models, per_sample_dpsgd
from mmfl.engine.attack import make_attack
from mmfl.engine.simulation import SimulationTransport
from mmfl.engine.stages.base import Round, Stage
from mmfl.engine.stages.checks import check_finite as _check_finite  # noqa: F401  (its home before)
from mmfl.engine.tracking import check_installed
from mmfl.engine.state_store import DiskClientStateStore, make_store
from mmfl.errors import ConfigError, MMFLError
from mmfl.models.factory import model_factory
from mmfl.report import load_metrics, summarize
from mmfl.schema import ExperimentConfig


# settings that change where or how often a run computes, not its result: a resume may change them
# (on_no_valid_reply: a run it stopped resumes with "skip")
RESUME_MAY_CHANGE = ("device", "gpus_per_client", "checkpoint_every", "threads", "on_no_valid_reply")


class Experiment:
    """One configured run. ``Experiment(cfg).run()`` does everything."""

    def __init__(self, cfg: ExperimentConfig, progress: bool = True,
                 transport: Callable[["Experiment"], Transport] | None = None,
                 stages: Sequence[type[Stage]] | None = None):
        """``transport`` builds the transport from this experiment (its spec,
        federation, store, ...); default: the in-process simulation. The round
        loop is the same for every transport (see :mod:`mmfl.flower`). ``stages``: the
        round's stages in order (default: :data:`mmfl.engine.pipeline.STAGES`)."""
        self.cfg = cfg
        self.progress = progress
        check_installed(cfg.tracking)  # a missing tracking library: one line before anything runs
        self.spec = ALGORITHMS.get(cfg.algorithm.name).factory
        self.device = resolve_device(cfg.run.device)  # where the run computes (mmfl.core.device)
        self.federation = build_federation(cfg, pooled=self.spec.pooled)
        for cid, c in enumerate(self.federation.clients):
            if len(c) == 0:
                raise ConfigError(f"partition: client {cid} received no samples; use fewer clients")
        self.federation = place_federation(self.federation, self.device)  # on the device once, if it fits
        self.make_model = model_factory(cfg, self.federation.meta, self.device)
        fed = self.federation
        if fed.client_modalities is not None or fed.client_groups is not None:  # fail now, not in round 1
            kinds = {(fed.modalities_of(c), fed.group_of(c), fed.source_of(c)) for c in range(fed.num_clients)}
            for held, group, src in kinds:
                self.make_model(held, group, None if src is None else fed.sources[src].meta)
        if per_sample_dpsgd(cfg):  # DP-SGD needs per-sample gradients of each model
            kinds = {(fed.modalities_of(c), fed.group_of(c), fed.source_of(c)) for c in range(fed.num_clients)}
            check_dpsgd_models([((cfg.model if g is None else cfg.client_models[g].model).name, self.make_model(
                h if h != tuple(fed.meta.modalities) else None, g, None if s is None else fed.sources[s].meta))
                for h, g, s in sorted(kinds, key=repr)])
        self.system = None  # [system]: simulated latency per round (mmfl.core.system)
        if cfg.system is not None:
            self.system = WirelessSystem(cfg, fed, lambda cid: self.make_model(
                fed.modalities_of(cid), fed.group_of(cid), fed.meta_of(cid)))
        train = train_for_run(cfg.train, cfg.run.rounds)  # a cosine lr's period resolved
        self.server = self.spec.server(cfg.algorithm.params, ServerContext(
            meta=self.federation.meta, train=train, seed=cfg.run.seed, rounds=cfg.run.rounds,
            num_clients=self.federation.num_clients, make_model=self.make_model,
            client_modalities=self.federation.client_modalities, public=self.federation.public,
            system=self.system, client_groups=self.federation.client_groups,
            client_sources=self.federation.client_sources, dp=cfg.dp,
            cohort_size=cohort_size(cfg, self.federation.num_clients),
            client_model=lambda cid: self.make_model(fed.modalities_of(cid), fed.group_of(cid), fed.meta_of(cid)),
            device=self.device))
        self.store = make_store(cfg.run.state_store, self.federation.num_clients, cfg.run_dir / "client_state",
                                self.device)
        if transport is not None:
            self.transport = transport(self)
        elif cfg.secure_aggregation is not None:  # SecAgg+ is Flower's protocol (mmfl.flower.secagg)
            raise ConfigError("secure_aggregation: SecAgg+ runs on Flower only (mmfl flower loopback|submit|"
                              "simulate); the in-process simulator has no server to hide updates from: remove "
                              "the [secure_aggregation] table for mmfl run")
        else:
            self.transport = SimulationTransport(
                self.spec, cfg.algorithm.params, self.federation, train, cfg.run.seed,
                self.make_model, self.store, on_nonfinite=cfg.run.on_nonfinite,
                batch_clients=cfg.run.batch_clients, privacy=cfg.privacy,
                local_dp=LocalDP(cfg.dp, cfg.run.seed) if cfg.dp is not None and cfg.dp.mode == "local" else None,
                attack=cfg.attack, stream=cfg.run.stream_aggregation, dp=cfg.dp, device=self.device)
        self.attack = make_attack(cfg.attack, self.federation.num_clients, cfg.run.seed)  # who is malicious
        # the round's stages (mmfl.engine.pipeline); each may refuse the config now
        self.stages = pipeline.build_stages(self, pipeline.STAGES if stages is None else stages)
        if cfg.run.stream_aggregation == "on" and self.server.train_accumulator(1) is None:
            print(f"mmfl: note: stream_aggregation = \"on\": {cfg.algorithm.name} with aggregation "
                  f"{getattr(cfg.algorithm.params, 'aggregation', '-')!r} needs the whole list of replies; "
                  "its rounds take the list path", file=sys.stderr, flush=True)

    # --- run folder -----------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    def _check_dir(self, resume: bool, overwrite: bool) -> None:
        """Refuse what the run folder does not allow (before and again after taking its lock)."""
        d = self.run_dir
        if resume:
            if not (d / "config.toml").is_file():
                raise MMFLError(f"{d}: nothing to resume (no config.toml); run without --resume")
        elif runfolder.contents(d):
            if not overwrite:
                raise MMFLError(f"{d}: run folder exists; use --resume to continue it, "
                                "--overwrite to replace it, or --set name=<new name>")
            runfiles.check_overwrite(d)  # only what the run recorded writing (mmfl.engine.runfiles)

    def _prepare_dir(self, resume: bool, overwrite: bool) -> int:
        """Create or reopen the run folder (its lock held); return the first round to run."""
        d = self.run_dir
        self._check_dir(resume, overwrite)
        if resume:
            # both sides as written by ExperimentConfig.to_toml (every default filled in); a
            # setting added to mmfl since the run started counts at its default
            mine = tomllib.loads(self.cfg.to_toml())
            theirs = with_new_defaults(runfolder.load_saved_config(d / "config.toml"), self.cfg)
            mine.pop("rounds"), theirs.pop("rounds", None)
            mine.pop("tracking", None), theirs.pop("tracking", None)  # tracking changes no result
            mine.pop("reference", None), theirs.pop("reference", None)  # nor do references (mmfl.reference)
            for key in RESUME_MAY_CHANGE:  # a run checkpointed on a GPU resumes on a CPU and vice versa
                mine.pop(key, None), theirs.pop(key, None)
            if mine != theirs:
                diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
                raise ConfigError(f"{d}: config differs from the saved run in {', '.join(diff)} "
                                  "(only 'rounds' may change on resume)")
            ckpt, damaged = checkpoint.resume_point(d / "checkpoints")
            if ckpt is None:
                start = 0
            else:
                if checkpoint.legacy(ckpt):  # an older mmfl's run (unmarked folder): resumes, said once
                    print(f"mmfl: warning: {ckpt}: checkpoint of an older mmfl (no {checkpoint.META_SUM}): its "
                          "meta.json cannot be verified, only the sha256 of its files (where it has them)",
                          file=sys.stderr, flush=True)
                server, clients, meta = checkpoint.load(ckpt, lazy_clients=True, verify=False)
                start = int(meta["round"])  # rounds completed = index of the next round
                if damaged:
                    self._fall_back(damaged, ckpt, start)
                self.server.load_state_dict(to_device(server, self.device))
                self.store.load_state_dict(clients)
            runfolder.truncate_metrics(d / "metrics.jsonl", start)
            runfolder.atomic_write(d / "config.toml", self.cfg.to_toml())
            return start
        if runfolder.contents(d):
            runfiles.clear(d)  # what the run wrote (_check_dir: nothing else is there), --overwrite
        runfiles.start(d)  # the marker: a folder mmfl created, its run id, the list of what it writes
        if isinstance(self.store, DiskClientStateStore):
            runfiles.record(d, "client_state/")
        runfolder.atomic_write(d / "config.toml", self.cfg.to_toml())
        return 0

    def _fall_back(self, damaged: list[str], ckpt: Path, start: int) -> None:
        """Resume from ``ckpt``, older than the damaged newest checkpoint(s): one line saying so."""
        if isinstance(self.store, DiskClientStateStore):  # its files hold the newer rounds' changes
            raise MMFLError(f"{self.run_dir}: checkpoint {'; '.join(damaged)}; the disk client-state store "
                            f"cannot go back to {ckpt.name} (its files are newer); start over with --overwrite")
        print(f"mmfl: checkpoint {'; '.join(damaged)}; resuming from {ckpt.name} "
              f"(metrics.jsonl truncated to round {start})", file=sys.stderr, flush=True)

    # --- the loop -------------------------------------------------------
    def run(self, resume: bool = False, overwrite: bool = False) -> dict:
        cfg = self.cfg
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        lock = runfolder.RunLock(self.run_dir)
        try:
            self._check_dir(resume, overwrite)  # refuse before creating anything (a lock file)
            lock.acquire()
            summary = self._run(resume, overwrite)
            for stage in reversed(self.stages):
                stage.close(failed=False)
            return summary
        except OSError as e:  # a full disk, output_dir a file, read-only, ...: one line
            raise runfolder.fs_error(e, self.run_dir) from None
        finally:
            for stage in reversed(self.stages):
                stage.close(failed=True)  # an error or an interrupt (no-op after a finished run)
            lock.release()

    def _run(self, resume: bool, overwrite: bool) -> dict:
        start = self._prepare_dir(resume, overwrite)
        label_map = (self.federation.meta.info or {}).get("label_map")
        if label_map:  # the ids a manifest gave its labels (mmfl.data.manifest)
            runfolder.atomic_write(self.run_dir / "labels.json", json.dumps(label_map, indent=2))
        runfiles.record(self.run_dir, "metrics.jsonl")
        for stage in self.stages:
            stage.start(start)
        for rnd in range(start, self.cfg.run.rounds):
            # a pooled (centralized) run has one client whatever clients_per_round says
            cohort = [0] if self.spec.pooled else sample_cohort(self.cfg, rnd, self.federation.num_clients)
            r = Round(rnd, time.perf_counter(), cohort)
            for stage in self.stages:
                stage.begin(r)
            for stage in self.stages:  # train, evaluate, record the row, checkpoint (mmfl.engine.pipeline)
                stage.round(r)
        return self._finish()

    # --- evaluation (mmfl.core.evaluation) -------------------------------
    def evaluations(self) -> dict[str, str]:
        """The server's declared evaluations, plus the personalized one with ``run.personal_eval``."""
        kinds = dict(self.server.evaluations)
        if self.cfg.run.personal_eval and "personalized" not in kinds:
            kinds["personalized"] = PERSONAL_PREFIX
        return kinds

    def eval_context(self, rnd: int) -> EvalContext:
        """What the evaluations get. The per-client personalized test rows are drawn here only
        when the clients' data is in this process; otherwise the clients draw their own."""
        fed, seed = self.federation, self.cfg.run.seed
        rows = None
        if self.transport.clients_in_process:
            rows = lambda: personal_test_indices(fed, fed.test, seed, fed.meta.num_classes)  # noqa: E731
        return EvalContext(rnd=rnd, test=fed.test, seed=seed, num_classes=fed.meta.num_classes,
                           num_clients=fed.num_clients, modalities_of=fed.modalities_of,
                           send=self.transport.send, personal_rows=rows)

    def _checkpoint(self, rnd: int) -> None:
        """After round ``rnd``: a checkpoint every ``checkpoint_every`` rounds and after the last one.
        Between checkpoints a disk store keeps the rounds' changes in its journal; it commits them
        only once a checkpoint holds them (mmfl.engine.state_store), so resume replays the newest one."""
        done = rnd + 1
        if done % self.cfg.run.checkpoint_every and done != self.cfg.run.rounds:
            return
        # named by rounds completed, like the metrics rows: round_00003 holds the state after round 3
        checkpoint.save(self.run_dir / "checkpoints", rnd + 1, self.server.state_dict(),
                        self.store, {"round": rnd + 1}, keep=self.cfg.run.keep_checkpoints)
        self.store.commit()  # a disk store moves the round's changes into its files (see mmfl.engine.state_store)

    def _finish(self) -> dict:
        rows = load_metrics(self.run_dir)
        summary = summarize(rows, self.cfg)
        runfolder.atomic_write(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        for stage in reversed(self.stages):
            stage.finish(summary)
        # no accuracy.png here (matplotlib's import is 0.5-1 s of a short run): `mmfl report RUN`,
        # `mmfl run --plot` or Result.plot() draw it from metrics.jsonl
        return summary

