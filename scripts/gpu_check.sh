#!/usr/bin/env bash
# The prepared GPU check (issue 26 item 4; docs/performance.md, "GPU check").
#
#   bash scripts/gpu_check.sh            # on a machine with one NVIDIA GPU: at most 8 minutes
#   bash scripts/gpu_check.sh --smoke    # every section on the CPU at tiny sizes (CI: tests/test_gpu_check.py)
#   MMFL_GPU_SMOKE=1 bash scripts/gpu_check.sh   # the same as --smoke
#
# Full mode: installs the wheels that scripts/gpu_wheels.sh put in .gpu_carry/wheels (no package
# index there) into a folder of their own (pip --target, first on PYTHONPATH: the machine's own
# packages are left alone), then runs benchmarks/perf/gpu_check.py with what is left of the budget
# (MMFL_GPU_BUDGET seconds in all, default 480). It writes accelerator-<gpu>.md/.json and
# gpu_check.log into $OUT (the device tool's folder that comes back) and into benchmarks/results/.
# Smoke mode: needs no wheels, writes into a temporary folder (or --out DIR), not the tree.
# Other arguments go to gpu_check.py (e.g. --sections tests moon). Always leaves its report, also
# when a section fails or the budget runs out; the exit code is 1 if a section failed.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
SMOKE=${MMFL_GPU_SMOKE:-0}
ARGS=()
for a in "$@"; do
  case $a in
    --smoke) SMOKE=1 ;;
    *) ARGS+=("$a") ;;
  esac
done
if [ "$SMOKE" = 1 ]; then
  PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  OUTS=()
  printf '%s\n' "${ARGS[@]}" | grep -qx -- --out || OUTS=(--out "$(mktemp -d -t mmfl-gpu-smoke-XXXXXX)")
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  exec "$PY" benchmarks/perf/gpu_check.py --smoke "${OUTS[@]}" "${ARGS[@]}"
fi

PY=${PYTHON:-python3}  # on the GPU machine: the interpreter that holds CUDA torch
TOTAL=${MMFL_GPU_BUDGET:-480}
RESULTS=benchmarks/results
OUTDIR=${OUT:-$RESULTS}
mkdir -p "$OUTDIR" "$RESULTS"
LOG="$OUTDIR/gpu_check.log"
echo "gpu_check: $(date -u '+%F %T') UTC on $(hostname); budget ${TOTAL} s" | tee "$LOG"
nvidia-smi -L 2>&1 | tee -a "$LOG" || true

SITE=/tmp/mmfl-gpu-site
if compgen -G ".gpu_carry/wheels/*.whl" >/dev/null; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
       .gpu_carry/wheels/*.whl >>"$LOG" 2>&1; then
    echo "gpu_check: installed $(ls .gpu_carry/wheels/*.whl | wc -l) carried wheels into $SITE ($(( $(date +%s) - T0 )) s)" | tee -a "$LOG"
    export PYTHONPATH="$SITE" MMFL_GPU_SITE="$SITE"
  else
    echo "gpu_check: the carried wheels did not install (see $LOG); sections that need them will say so" | tee -a "$LOG"
  fi
else
  echo "gpu_check: no .gpu_carry/wheels (run scripts/gpu_wheels.sh here and name .gpu_carry in carry);" \
       "flwr, opacus, mvlearn and tomli_w are only there if the machine has them" | tee -a "$LOG"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0

LEFT=$(( TOTAL - ($(date +%s) - T0) - 15 ))
[ "$LEFT" -lt 30 ] && LEFT=30
OUTS=(--out "$OUTDIR")
[ "$OUTDIR" != "$RESULTS" ] && OUTS+=(--out "$RESULTS")
timeout -k 10 $(( LEFT + 12 )) "$PY" benchmarks/perf/gpu_check.py --budget "$LEFT" "${OUTS[@]}" --log "$LOG" "${ARGS[@]}" \
  2>&1 | tee -a "$LOG"
RC=${PIPESTATUS[0]}
REPORT=$(ls -t "$OUTDIR"/accelerator-*.md 2>/dev/null | head -1)
if [ "$RC" -ne 0 ] && [ "$RC" -ne 1 ]; then
  NOTE="**The check stopped early** (exit code $RC$([ "$RC" -eq 124 ] && echo ': the whole budget ran out'); see gpu_check.log)."
  if [ -n "$REPORT" ]; then
    for f in "$REPORT" "$RESULTS/$(basename "$REPORT")"; do [ -f "$f" ] && printf '\n%s\n' "$NOTE" >>"$f"; done
  else
    REPORT="$OUTDIR/accelerator-unknown.md"
    { echo "# GPU check: stopped before its first report"; echo; echo "$NOTE"; echo; echo '```'
      tail -40 "$LOG"; echo '```'; } >"$REPORT"
  fi
fi
echo "gpu_check: report $REPORT; $(( $(date +%s) - T0 )) s in all" | tee -a "$LOG"
exit "$RC"
