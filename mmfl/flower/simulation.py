"""mmfl on Flower's simulation engine (Ray backend).

``simulate(cfg)`` runs the mmfl ServerApp in this process and the ClientApp on
``num_supernodes`` virtual SuperNodes whose messages Ray actors execute. Each
virtual SuperNode ``k`` gets Flower's node config ``partition-id=k
num-partitions=num_supernodes`` and so hosts the mmfl clients ``c`` with
``c % num_supernodes == k`` (default: one SuperNode per client).
"""

from __future__ import annotations

import logging
import os

from mmfl.schema import ExperimentConfig
from mmfl.errors import MMFLError


def count_clients(cfg: ExperimentConfig) -> int:
    n = getattr(cfg.partition.params, "num_clients", None)
    if isinstance(n, int) and n > 0 and cfg.algorithm.name != "centralized" and not cfg.client_data:
        return n
    from mmfl.algorithms import ALGORITHMS
    from mmfl.data.federation import build_federation

    return build_federation(cfg, pooled=ALGORITHMS.get(cfg.algorithm.name).factory.pooled).num_clients


def simulate(cfg: ExperimentConfig, num_supernodes: int | None = None, overwrite: bool = False,
             ray_cpus: int | None = None, cpus_per_client: float = 1.0, verbose: bool = False) -> dict:
    """Run ``cfg`` on Flower's simulation engine; the run's summary (as ``mmfl run``)."""
    from flwr.simulation import run_simulation

    from mmfl.flower.client_app import make_client_app
    from mmfl.flower.server_app import make_server_app

    n = num_supernodes or count_clients(cfg)
    if n < 1:
        raise MMFLError(f"--num-supernodes: must be >= 1, got {n}")
    cpus = ray_cpus or os.cpu_count() or 1
    backend_config = {
        "client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
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
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silence a Ray FutureWarning
    try:
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
