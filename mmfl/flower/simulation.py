"""mmfl on Flower's simulation engine (Ray backend).

``simulate(cfg)`` runs mmfl's Flower app the way Flower's own simulations run (``flwr run``
against a SuperLink started with ``--simulation``): the ServerApp in a process of that
SuperLink, the ClientApp on ``num_supernodes`` virtual SuperNodes whose messages Ray actors
execute. Each
virtual SuperNode ``k`` gets Flower's node config ``partition-id=k
num-partitions=num_supernodes`` and so hosts the mmfl clients ``c`` with
``c % num_supernodes == k`` (default: one SuperNode per client).

GPUs: each ClientApp actor asks Ray for ``run.gpus_per_client`` GPUs (e.g. 0.25: four actors
share one GPU) and Ray is given every GPU this machine has; an actor then resolves the run's
``device`` on the GPU Ray assigned it (``auto`` -> ``cuda``). With ``gpus_per_client = 0``
Ray hides the GPUs from the actors (their ``auto`` is the CPU; ``device = "cuda"`` is refused
before Ray starts), while the ServerApp uses the run's device as ``mmfl run``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from mmfl.schema import ExperimentConfig
from mmfl.errors import ConfigError, MMFLError

# Ray: hide the GPUs from actors that asked for none (Ray's default today)
_HIDE_GPUS_ON_ZERO = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"


def count_clients(cfg: ExperimentConfig) -> int:
    n = getattr(cfg.partition.params, "num_clients", None)
    if isinstance(n, int) and n > 0 and cfg.algorithm.name != "centralized" and not cfg.client_data:
        return n
    from mmfl.algorithms import ALGORITHMS
    from mmfl.data.federation import build_federation

    return build_federation(cfg, pooled=ALGORITHMS.get(cfg.algorithm.name).factory.pooled).num_clients


def visible_gpus() -> int:
    """CUDA GPUs this process sees (0 without a CUDA build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_resources(gpus_per_client: float, device: str, num_gpus: int | None = None) -> tuple[float, int]:
    """``(num_gpus per ClientApp actor, num_gpus Ray may use)`` for a run with
    ``gpus_per_client`` on a machine with ``num_gpus`` GPUs (None: count them); a request this
    machine cannot meet is a ConfigError (one line) rather than actors Ray never schedules."""
    gpus_per_client = float(gpus_per_client)
    if gpus_per_client < 0:
        raise ConfigError(f"gpus_per_client: must be >= 0, got {gpus_per_client:g}")
    if gpus_per_client == 0:
        if device == "cuda" or device.startswith("cuda:"):
            raise ConfigError(f"device = {device!r} with gpus_per_client = 0: Ray gives the ClientApp actors no "
                              "GPU; set gpus_per_client (e.g. --gpus-per-client 0.25) or device = \"auto\"")
        return 0.0, 0
    n = visible_gpus() if num_gpus is None else num_gpus
    if n == 0:
        raise ConfigError(f"gpus_per_client = {gpus_per_client:g} but this machine has no CUDA GPU visible to "
                          "torch; set gpus_per_client = 0 (--gpus-per-client 0) to simulate on the CPU")
    if gpus_per_client > n:
        raise ConfigError(f"gpus_per_client = {gpus_per_client:g} but this machine has {n} GPU(s): no ClientApp "
                          "actor could be placed")
    if gpus_per_client > 1 and not gpus_per_client.is_integer():
        raise ConfigError(f"gpus_per_client = {gpus_per_client:g}: Ray takes a fraction of one GPU or a whole "
                          "number of GPUs")
    return gpus_per_client, n


def federation_config(n: int, cpus_per_client: float, gpus_per_client: float, ray_cpus: int, ray_gpus: int,
                      verbose: bool) -> list[str]:
    """``flwr run --federation-config`` entries of a simulation run (Flower's SimulationConfig)."""
    if cpus_per_client < 1 or not float(cpus_per_client).is_integer():
        raise ConfigError(f"--cpus-per-client {cpus_per_client:g}: Flower's simulation engine gives each ClientApp "
                          "a whole number of CPUs (>= 1)")
    return [f"num-supernodes={n}", f"client-resources-num-cpus={int(cpus_per_client)}",
            f"client-resources-num-gpus={float(gpus_per_client)!r}", f"init-args-num-cpus={int(ray_cpus)}",
            f"init-args-num-gpus={int(ray_gpus)}", f"init-args-logging-level='{'INFO' if verbose else 'ERROR'}'",
            f"init-args-log-to-driver={'true' if verbose else 'false'}", f"verbose={'true' if verbose else 'false'}"]


def simulate(cfg: ExperimentConfig, num_supernodes: int | None = None, overwrite: bool = False,
             ray_cpus: int | None = None, cpus_per_client: float = 1.0, verbose: bool = False,
             workdir: Path | None = None) -> dict:
    """Run ``cfg`` on Flower's simulation engine; the run's summary (as ``mmfl run``).

    Flower's current entry point: a SuperLink in simulation mode (``flower-superlink
    --simulation``, on 127.0.0.1, stopped at the end) and ``flwr run`` of mmfl's app with
    ``--federation-config`` (``num-supernodes``, the actors' resources); the ServerApp and the
    Ray engine run in the processes that SuperLink starts. Each ClientApp actor gets
    ``cfg.run.gpus_per_client`` GPUs (see :func:`gpu_resources`). A ``mmfl: error: ...`` of
    the ServerApp is raised here as that one line."""
    from mmfl.config import apply_overrides, resolve
    from mmfl.flower.deploy import LocalDeployment

    gpus_per_client, ray_gpus = gpu_resources(cfg.run.gpus_per_client, cfg.run.device)
    n = num_supernodes or count_clients(cfg)
    if n < 1:
        raise MMFLError(f"--num-supernodes: must be >= 1, got {n}")
    fed = federation_config(n, cpus_per_client, gpus_per_client, ray_cpus or os.cpu_count() or 1, ray_gpus, verbose)
    # the ServerApp runs in the SuperLink's folder: the run folder by its absolute path
    cfg = resolve(apply_overrides(cfg.to_dict(), [f"output_dir={json.dumps(str(Path(cfg.run.output_dir).resolve()))}"]))
    # Ray: actors with num_gpus = 0 see no GPU (Ray's workers read it; its FutureWarning announces
    # the opposite default, so it is set explicitly)
    env = {_HIDE_GPUS_ON_ZERO: os.environ.get(_HIDE_GPUS_ON_ZERO, "1"), "PYTHONWARNINGS": "ignore::FutureWarning"}
    tmp = None if workdir else tempfile.mkdtemp(prefix="mmfl-flower-sim-")
    where = Path(workdir or tmp)
    done = cfg.run_dir / "summary.json"
    try:
        with LocalDeployment(0, where, simulation=True, env=env) as link:
            run_id = link.submit(cfg, overwrite=overwrite, federation_config=fed)
            status = link.wait(run_id, done_file=done)
            logtext = link.run_log(run_id)
            if verbose:
                print(logtext, file=sys.stderr)
            if status != "finished:completed":
                errors = [line.strip() for line in logtext.splitlines() if line.strip().startswith("mmfl: error: ")]
                if errors:
                    raise MMFLError(errors[-1].removeprefix("mmfl: error: "))
                print(logtext[-3000:], file=sys.stderr)
                raise MMFLError(f"Flower simulation run {run_id} {status} (SuperLink log: {where / 'superlink.log'})")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return json.loads(done.read_text()) if done.is_file() else {}
