"""mmfl on Flower (``pip install "mmfl[flower]"``, flwr 1.41 or 1.42).

- :mod:`mmfl.flower.records`: mmfl messages <-> Flower ``RecordDict``;
- :mod:`mmfl.flower.transport`: ``FlowerTransport``, the engine's transport over a Flower ``Grid``;
- :mod:`mmfl.flower.server_app` / :mod:`mmfl.flower.client_app`: the ``ServerApp`` (the
  :class:`~mmfl.engine.runner.Experiment` round loop) and the ``ClientApp``;
- :mod:`mmfl.flower.simulation`: Flower's simulation engine (Ray);
- :mod:`mmfl.flower.deploy`: ``flwr run`` submission and a loopback deployment;
- ``app/``: the Flower app folder ``flwr run`` takes;
- :mod:`mmfl.flower.secagg`: SecAgg+ with Flower's workflow and mod;
- :mod:`mmfl.flower.superlink`: ``mmfl flower superlink``, Flower's SuperLink behind an operator guard.

Only Flower's public API is used (tests/test_flower_imports.py).

See docs/flower.md.
"""

import os

# Flower phones home (telemetry, update checks) unless told not to; mmfl opts out
# unless the user set these variables.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
