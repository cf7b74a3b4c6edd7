#!/usr/bin/env bash
# Run the test suite (sets up .venv first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# in parallel worker processes (pytest-xdist), one test file per worker at a time: the
# real-Flower-process tests wait on subprocesses much of the time (serial: 884 s, 3 workers:
# 747 s on 2 cores); MMFL_TEST_WORKERS=0 runs serially. --no-loadscope-reorder: the files in
# tests/conftest.py's order (the Flower-process files first), not the largest files first
exec .venv/bin/python -m pytest -q -n "${MMFL_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
