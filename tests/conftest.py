"""Session-wide test settings: nothing is left in the temp folder after a session.

- The preprocessing cache (mmfl.data.cache) goes to a temporary folder, never to the user's
  ~/.cache/mmfl, and that folder is deleted when the session ends (before: each session left
  one, 34 MB with the real emoji package present).
- torch's compile caches (TorchInductor, Triton) go into that folder too.
- ``tmp_path`` folders of passing tests are deleted at the end of the session
  (``tmp_path_retention_policy = "failed"`` in pyproject's [tool.pytest.ini_options]); a failed
  test's folder is kept for debugging (the last 3 sessions' ones).
"""

import os
import shutil
import tempfile

import pytest

# pytest-xdist workers (scripts/test.sh runs the suite in parallel) share the controller's
# folder: they inherit its environment; the cache writes to a temporary name and renames
_WORKER = "PYTEST_XDIST_WORKER" in os.environ and "MMFL_CACHE_DIR" in os.environ
_SESSION_TMP = os.environ["MMFL_CACHE_DIR"] if _WORKER else tempfile.mkdtemp(prefix="mmfl-test-cache-")
os.environ["MMFL_CACHE_DIR"] = _SESSION_TMP
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_SESSION_TMP, "torchinductor"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_SESSION_TMP, "triton"))


# the files that start real Flower processes (SuperLink, SuperNodes, Ray) or test processes
# (the mutation subset) take most of the suite's time, much of it waiting: collected first, in
# this order, so that in a parallel run they start first and overlap with the rest instead of
# running last on their own. scripts/test.sh passes --no-loadscope-reorder: pytest-xdist 3.x
# otherwise hands out the files with the most tests first, which put these last (seen in a
# timed run: test_docs_commands, test_capabilities and test_privacy_corpus started first).
_SLOW_FILES = ("test_flower.py", "test_flower_missing.py", "test_flower_secagg.py", "test_flower_resume.py",
               "test_flower_deploy.py", "test_mutants.py", "test_flower_device.py")


def pytest_collection_modifyitems(session, config, items):
    order = {name: i for i, name in enumerate(_SLOW_FILES)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # stable: the order within stays


def pytest_sessionfinish(session, exitstatus):
    if not _WORKER:  # the controller (or a serial run) removes the shared folder at the end
        shutil.rmtree(_SESSION_TMP, ignore_errors=True)


# waits for an event (a Flower run to finish, a subprocess, a node to answer) poll for it with a
# ceiling scaled by MMFL_TEST_TIMEOUT_SCALE (default 4: a machine at load 40 took 149 s for a round
# that takes 20 s idle); a test proves behaviour, not the machine's speed (issue 27, item 5)
TIMEOUT_SCALE = float(os.environ.get("MMFL_TEST_TIMEOUT_SCALE", "4"))


def patience(seconds: float) -> float:
    """The ceiling of a wait of ``seconds`` on an idle machine, scaled for this one."""
    return seconds * TIMEOUT_SCALE


def wait_for(done, seconds: float, what: str, poll: float = 0.1):
    """Poll ``done()`` until it returns something truthy (returned) or ``patience(seconds)`` passed."""
    import time

    deadline = time.monotonic() + patience(seconds)
    while True:
        got = done()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {patience(seconds):.0f} s "
                                 f"(MMFL_TEST_TIMEOUT_SCALE={TIMEOUT_SCALE:g}; raise it on a loaded machine)")
        time.sleep(poll)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (files that run many tiny trainings ask for it:
    ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
