"""Every use of a non-public ``flwr`` module in mmfl, in this one module.

Flower's public API (flwr 1.42: ``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``,
``flwr.simulation`` and the documented ``flwr.server`` / ``flwr.client`` / ``flwr.common``
classes) has no equivalent for what follows; each entry says what mmfl needs it for. It is
the one place to check when a Flower release changes them (tests/test_flower_imports.py
allows a private ``flwr`` import here and nowhere else; tests/test_flower.py,
test_flower_secagg.py and test_flower_deploy.py exercise every entry).

1. ``flwr.common.constant.ErrorCode``: a reply's ``Error.code`` is a plain int in
   ``flwr.app.Error``; the codes "node/message unavailable" (a SuperNode left) are named only here.
2. SecAgg+'s record layout (``flwr.common.secure_aggregation.secaggplus_constants``,
   ``flwr.compat.common.recorddict_compat``, ``flwr.server.workflow.constant``): mmfl runs
   Flower's documented ``SecAggPlusWorkflow`` and ``secaggplus_mod`` (the current SecAgg+
   components; Flower has no Message-API SecAgg+) but joins its own train messages to their
   collect stage, so it reads the stage from the workflow's config record, hands the mod
   the FitRes it expects, and seeds the workflow's ``LegacyContext`` state.
3. Run status (``flwr.cli`` / ``flwr.proto`` Control API client): ``mmfl flower`` polls a run
   every 2 s; ``flwr ls --run-id N --format json`` answers the same but costs a process start
   (about a CPU second) per poll, so :func:`run_status` asks in-process and falls back to
   that command when this Flower release changed the client.
4. ``flwr.superlink.main._get_middleware`` and the ``flower-superlink`` entry point:
   ``mmfl flower superlink`` adds one ASGI middleware in front of Flower's (see
   mmfl/flower/superlink.py); Flower has no hook for it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess

from flwr.common.constant import ErrorCode
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.compat.common.recorddict_compat import fitres_to_recorddict
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key as WorkflowKey

__all__ = ["UNAVAILABLE", "RECORD_KEY_CONFIGS", "RECORD_KEY_STATE", "Key", "Stage", "fitres_to_recorddict",
           "MAIN_CONFIGS_RECORD", "MAIN_PARAMS_RECORD", "WorkflowKey", "run_status", "patch_superlink"]

# 1. the reply error codes of a SuperNode that is gone (its messages will never be answered)
UNAVAILABLE = {ErrorCode.NODE_UNAVAILABLE, getattr(ErrorCode, "MESSAGE_UNAVAILABLE", -1)}


# 3. run status
def _status_in_process(run_id: int, connection: str) -> list[tuple[str, str]]:
    """``[(status, sub_status)]`` of run ``run_id`` through the Control API client of ``flwr ls``."""
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    client = None
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it announces the connection
            client = init_http_client_from_connection(read_superlink_connection(connection))
        res = client.ListRuns(ListRunsRequest(run_id=run_id))
    finally:
        if client is not None:
            client.close()
    return [(r.status.status, r.status.sub_status) for r in map(run_from_proto, res.run_dict.values())]


def _status_cli(run_id: int, connection: str, flwr: str, env: dict) -> list[tuple[str, str]]:
    """The same through ``flwr ls --run-id N --format json`` (Flower's public CLI)."""
    proc = subprocess.run([flwr, "ls", connection, "--run-id", str(run_id), "--format", "json"], env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout
    res = json.loads(out[out.index("{"):]) if "{" in out else {}
    if proc.returncode != 0 or not res.get("success", False):
        raise RuntimeError(" ".join(str(res.get("error-message", proc.stderr.strip()[-300:])).split()))
    runs = []
    for r in res.get("runs", []):
        status, _, sub = str(r.get("status", "")).partition(":")
        runs.append((status, sub))
    return runs


def run_status(run_id: int, connection: str, flwr_home: str, flwr: str, env: dict) -> str | None:
    """``status[:sub_status]`` of run ``run_id`` on the SuperLink of ``connection`` (``None``: no
    such run); raises on a failure to ask."""
    old = os.environ.get("FLWR_HOME")
    os.environ["FLWR_HOME"] = str(flwr_home)
    try:
        runs = _status_in_process(run_id, connection)
    except (ImportError, AttributeError, TypeError):  # this Flower release moved the client: ask the CLI
        runs = _status_cli(run_id, connection, flwr, env)
    finally:
        if old is None:
            os.environ.pop("FLWR_HOME", None)
        else:
            os.environ["FLWR_HOME"] = old
    if not runs:
        return None
    status, sub = runs[0]
    return f"{status}:{sub}" if sub else status


# 4. the SuperLink's middleware
def patch_superlink(middleware) -> object:
    """Put ``middleware`` (a starlette ``Middleware``) in front of Flower's own in the SuperLink
    this process will start; Flower's ``flower-superlink`` entry point (call it with ``sys.argv``
    set). Raises ``RuntimeError`` where this Flower release has no such hook."""
    import flwr.superlink.main as flower_main

    original = getattr(flower_main, "_get_middleware", None)
    if original is None:
        raise RuntimeError("flwr.superlink.main._get_middleware is gone")
    flower_main._get_middleware = lambda: [middleware, *original()]
    from flwr.superlink.cli.flower_superlink import flower_superlink

    return flower_superlink
