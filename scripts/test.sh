#!/usr/bin/env bash
# Run the test suite (sets up .venv first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
