#!/usr/bin/env bash
# benchmarks/gpu_check.sh: the CUDA path's check, on a machine with a CUDA device, no network and its
# own CUDA build of torch (any version: it is never replaced).
#
# Steps, each with what is left of one time limit (default 300 s; a step past it is stopped and
# recorded as failed, the others still run):
#   1. a venv (--system-site-packages: it sees the machine's torch) at .venv-gpu;
#   2. the wheels it lacks, from a wheelhouse brought along (pip install --no-index --no-deps);
#      build the wheelhouse on a machine with network: `make wheelhouse` (wheelhouse/);
#   3. the tests parametrized by device, CUDA cases only (tests/test_embedding.py -k cuda);
#   4. bench_inmemory --quick (cosparse, cosparse_inline, dense_bound) --device cuda;
#   5. bench_tiers --quick --device cuda;
#   6. bench_ab --quick (train.device auto: the GPU).
# Everything lands in one folder (default benchmarks/results/gpu/<UTC date>/): each step's log, the
# benchmarks' JSON, env.txt (torch, CUDA, GPU) and summary.txt (each step's exit status and seconds).
#
#   bash benchmarks/gpu_check.sh [--wheelhouse DIR] [--out DIR] [--venv DIR] [--python PY]
#                                [--time-limit S] [--all-wheels] [--dry-run]
# --dry-run prints the steps (with the limits they would get) and runs nothing.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELHOUSE="$REPO/wheelhouse"
OUT="$REPO/benchmarks/results/gpu/$(date -u +%Y-%m-%d)"
VENV="$REPO/.venv-gpu"
PY="python3"
LIMIT=300
ALL_WHEELS=""
DRY=0

die() { echo "gpu_check: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) WHEELHOUSE="${2:?--wheelhouse needs a folder}"; shift 2 ;;
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --venv) VENV="${2:?--venv needs a folder}"; shift 2 ;;
    --python) PY="${2:?--python needs an interpreter}"; shift 2 ;;
    --time-limit) LIMIT="${2:?--time-limit needs seconds}"; shift 2 ;;
    --all-wheels) ALL_WHEELS="--all"; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
case "$LIMIT" in ''|*[!0-9]*) die "--time-limit: '$LIMIT' is not a whole number of seconds" ;; esac
[ "$LIMIT" -ge 60 ] || die "--time-limit: $LIMIT s leaves no room for the benchmarks (60 at least)"

START=$(date +%s)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the project runs from its sources
VPY="$VENV/bin/python"
SUMMARY="$OUT/summary.txt"
FAILED=0

left() { echo $(( LIMIT - ($(date +%s) - START) )); }

# step NAME CAP COMMAND...: run COMMAND in the repository root, for at most min(CAP, time left)
# seconds, its output in OUT/NAME.log; record its exit status and seconds in the summary.
step() {
  local name="$1" cap="$2"; shift 2
  local budget; budget=$(left)
  if [ "$cap" -lt "$budget" ]; then budget="$cap"; fi
  if [ "$DRY" = 1 ]; then
    printf 'step %-14s limit %4s s: %s\n' "$name" "$budget" "$*"
    return 0
  fi
  if [ "$budget" -le 5 ]; then
    echo "$name rc=skipped (time limit reached) s=0" | tee -a "$SUMMARY"
    FAILED=1
    return 0
  fi
  echo "== $name (limit $budget s): $*"
  local t0 rc; t0=$(date +%s)
  set +e
  (cd "$REPO" && timeout --kill-after=10 "$budget" "$@") >"$OUT/$name.log" 2>&1
  rc=$?
  set -e
  local note=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then note=" (stopped at the time limit)"; fi
  echo "$name rc=$rc s=$(( $(date +%s) - t0 ))$note" | tee -a "$SUMMARY"
  [ "$rc" = 0 ] || { FAILED=1; tail -n 20 "$OUT/$name.log" >&2; }
}

if [ "$DRY" = 0 ]; then
  command -v "$PY" >/dev/null || die "--python: '$PY' not found"
  "$PY" -c "import torch" 2>/dev/null || die "'$PY' has no torch: this machine's CUDA build of torch is expected"
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "torch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA device here"
  [ -d "$WHEELHOUSE" ] || die "wheelhouse $WHEELHOUSE not found: build it with 'make wheelhouse' where there is network, bring it, pass --wheelhouse DIR"
  mkdir -p "$OUT"
  : >"$SUMMARY"
  [ -x "$VPY" ] || "$PY" -m venv --system-site-packages "$VENV"
fi

# the wheels the venv lacks (never torch); the machine's own packages are kept
# shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
INSTALL='set -e; mapfile -t W < <("$0" -m benchmarks.wheelhouse missing "$1" $2);
  if [ ${#W[@]} -gt 0 ]; then "$0" -m pip install --no-index --no-deps --find-links "$1" "${W[@]}"; fi;
  "$0" -m pip check || echo "pip check: see above (the machine torch may pin other versions)"'
step install 120 bash -c "$INSTALL" "$VPY" "$WHEELHOUSE" "$ALL_WHEELS"
step env 30 "$VPY" -c "import torch, numpy, numba, cosparse
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'numba', numba.__version__)
print('device', torch.cuda.get_device_name(0), 'capability', torch.cuda.get_device_capability(0))"
step cuda_tests 60 "$VPY" -m pytest -q -p no:cacheprovider -k cuda tests/test_embedding.py
step bench_inmemory 75 "$VPY" -m benchmarks.bench_inmemory --quick --device cuda \
  --contenders cosparse,cosparse_inline,dense_bound --json "$OUT/bench_inmemory_quick.json"
step bench_tiers 75 "$VPY" -m benchmarks.bench_tiers --quick --device cuda --json "$OUT/bench_tiers_quick.json"
step bench_ab 75 "$VPY" -m benchmarks.bench_ab --quick --json "$OUT/bench_ab_quick.json"

if [ "$DRY" = 1 ]; then
  echo "out: $OUT (logs, JSON, env.txt, summary.txt); venv: $VENV; wheelhouse: $WHEELHOUSE; limit: $LIMIT s"
  exit 0
fi
[ -f "$OUT/env.log" ] && cp "$OUT/env.log" "$OUT/env.txt"
echo "total $(( $(date +%s) - START )) s; results in $OUT" | tee -a "$SUMMARY"
exit "$FAILED"
