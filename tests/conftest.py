"""Session-wide test settings: the preprocessing cache (mmfl.data.cache) goes to a
temporary folder, never to the user's ~/.cache/mmfl."""

import os
import tempfile

os.environ["MMFL_CACHE_DIR"] = tempfile.mkdtemp(prefix="mmfl-test-cache-")
