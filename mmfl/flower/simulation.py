"""mmfl on Flower's simulation engine (Ray backend).

``simulate(cfg)`` runs the mmfl ServerApp in this process and the ClientApp on
``num_supernodes`` virtual SuperNodes whose messages Ray actors execute. Each
virtual SuperNode ``k`` gets Flower's node config ``partition-id=k
num-partitions=num_supernodes`` and so hosts the mmfl clients ``c`` with
``c % num_supernodes == k`` (default: one SuperNode per client).

GPUs: each ClientApp actor asks Ray for ``run.gpus_per_client`` GPUs (e.g. 0.25: four actors
share one GPU) and Ray is given every GPU this machine has; an actor then resolves the run's
``device`` on the GPU Ray assigned it (``auto`` -> ``cuda``). With ``gpus_per_client = 0``
Ray hides the GPUs from the actors (their ``auto`` is the CPU; ``device = "cuda"`` is refused
before Ray starts), while the ServerApp, in this process, uses the run's device as ``mmfl run``.
"""

from __future__ import annotations

import logging
import os
import warnings

from mmfl.schema import ExperimentConfig
from mmfl.errors import ConfigError, MMFLError

# Ray: hide the GPUs from actors that asked for none (Ray's default today; its FutureWarning
# announces the opposite default, so it is set explicitly)
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


def simulate(cfg: ExperimentConfig, num_supernodes: int | None = None, overwrite: bool = False,
             ray_cpus: int | None = None, cpus_per_client: float = 1.0, verbose: bool = False) -> dict:
    """Run ``cfg`` on Flower's simulation engine; the run's summary (as ``mmfl run``).
    Each ClientApp actor gets ``cfg.run.gpus_per_client`` GPUs (see :func:`gpu_resources`)."""
    from flwr.simulation import run_simulation

    from mmfl.flower.client_app import make_client_app
    from mmfl.flower.server_app import make_server_app

    gpus_per_client, ray_gpus = gpu_resources(cfg.run.gpus_per_client, cfg.run.device)
    n = num_supernodes or count_clients(cfg)
    if n < 1:
        raise MMFLError(f"--num-supernodes: must be >= 1, got {n}")
    cpus = ray_cpus or os.cpu_count() or 1
    backend_config = {
        "client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
        "init_args": {"num_cpus": cpus, "num_gpus": ray_gpus, "include_dashboard": False,
                      "object_store_memory": 256 * 1024 * 1024,
                      "logging_level": logging.INFO if verbose else logging.ERROR, "log_to_driver": verbose},
    }
    text = cfg.to_toml()
    summary: dict = {}
    server_app = make_server_app(text, overwrite=overwrite, announce=False)
    client_app = make_client_app(text)
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    if not verbose:  # e.g. run_simulation's deprecation notice: mmfl pins flwr 1.41, where it works
        flwr_log.setLevel(logging.ERROR)
    os.environ.setdefault(_HIDE_GPUS_ON_ZERO, "1")  # actors with num_gpus = 0 see no GPU (Ray's workers read it)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", category=FutureWarning)
            run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n,
                           backend_name="ray", backend_config=backend_config, verbose_logging=verbose)
    except RuntimeError as e:  # the engine wraps the ServerApp's exception
        cause = e.__cause__ or e.__context__
        if isinstance(cause, MMFLError):
            raise cause from None
        raise
    finally:
        flwr_log.setLevel(level)
        _shutdown_ray()
    summary_path = cfg.run_dir / "summary.json"
    if summary_path.is_file():
        import json

        summary = json.loads(summary_path.read_text())
    return summary


def _shutdown_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except ImportError:  # pragma: no cover
        pass
