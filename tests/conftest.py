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

_SESSION_TMP = tempfile.mkdtemp(prefix="mmfl-test-cache-")
os.environ["MMFL_CACHE_DIR"] = _SESSION_TMP
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_SESSION_TMP, "torchinductor"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_SESSION_TMP, "triton"))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)
