"""The mmfl ``ServerApp``: the round loop of :class:`mmfl.engine.runner.Experiment`
with a :class:`~mmfl.flower.transport.FlowerTransport`.

The run config (``flwr run --run-config``, see :mod:`mmfl.flower.deploy`) has

- ``mmfl-config``: the resolved mmfl config as TOML text (the same file
  ``mmfl run`` would take, every default filled in);
- ``mmfl-overwrite``: replace an existing run folder (default false);
- ``mmfl-resume``: continue the run folder from its last intact checkpoint (default
  false); clients' state comes from the SuperNodes' ``state-dir``
  (:mod:`mmfl.flower.node_state`).

The run folder (metrics, checkpoints, summary) is written where the ServerApp
runs, i.e. on the SuperLink's machine, at the config's ``output_dir/name``
(a relative ``output_dir`` is relative to the SuperLink's working directory).
The server holds the test set and the data set's metadata; it builds the same
partition as the SuperNodes only to check that every node's slice matches.
Client state lives on the SuperNodes, so checkpoints hold only the server's
state; a run can be resumed when the SuperNodes keep their clients' state on disk
(``state-dir`` node config), see docs/flower.md.
"""

from __future__ import annotations

import json
import logging
import tomllib

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from mmfl.config import resolve
from mmfl.errors import MMFLError
from mmfl.flower.client_app import CONFIG_KEY, run_config_text  # noqa: F401  (CONFIG_KEY: re-exported)

OVERWRITE_KEY = "mmfl-overwrite"
RESUME_KEY = "mmfl-resume"
STATE_FILE = "flower_state.json"  # in the run folder: the run's client-state id (mmfl.flower.node_state)
log = logging.getLogger("mmfl.flower")


def run_server(grid: Grid, config_text: str, overwrite: bool = False,
               wait_for_nodes_s: float | None = None, announce: bool = True, resume: bool = False) -> dict:
    """Run the experiment of ``config_text`` with its clients behind ``grid``; its summary."""
    from mmfl.engine.runner import Experiment
    from mmfl.flower.tap import recording_grid
    from mmfl.flower.transport import FlowerTransport

    cfg = resolve(tomllib.loads(config_text))
    grid = recording_grid(grid)  # MMFL_FLOWER_TAP: every message the ServerApp receives, to a folder

    def transport(e):
        t = FlowerTransport(grid, e.federation, cfg.run, wait_for_nodes_s=wait_for_nodes_s,
                            state_file=cfg.run_dir / STATE_FILE, device=e.device)
        if cfg.secure_aggregation is not None:  # the train round's sum through SecAgg+
            from mmfl.flower.secagg import SecureAggregation

            t.secure = SecureAggregation(cfg.secure_aggregation, e.federation)
        return t

    exp = Experiment(cfg, progress=False, transport=transport)
    log.info("mmfl: %s (%s) on %d clients, %d SuperNodes", cfg.run.name, cfg.algorithm.name,
             exp.federation.num_clients, len(set(exp.transport.node_of.values())))
    summary = exp.run(resume=resume, overwrite=overwrite)
    if announce:  # into the run's log (flwr log RUN_ID)
        print(f"mmfl: results in {cfg.run_dir.resolve()}", flush=True)
        print("mmfl: summary " + json.dumps(summary), flush=True)
    return summary


def make_server_app(config_text: str | None = None, overwrite: bool = False, announce: bool = True) -> ServerApp:
    """The ServerApp; ``config_text``/``overwrite`` apply when the run config has none."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        over = bool(context.run_config.get(OVERWRITE_KEY, overwrite))
        resume = bool(context.run_config.get(RESUME_KEY, False))
        try:
            text = run_config_text(context.run_config, config_text)  # mmfl-config with mmfl-set applied
            run_server(grid, text, overwrite=over, announce=announce, resume=resume)
        except MMFLError as e:
            print(f"mmfl: error: {e}", flush=True)
            raise

    return app
