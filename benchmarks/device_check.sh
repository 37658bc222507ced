#!/usr/bin/env bash
# The parity suite and the step benchmarks on whatever JAX backend is present (an accelerator
# machine, typically), in under 8 minutes, with the results in $OUT (a temporary folder if unset).
#
#   bash benchmarks/device_check.sh            # from anywhere; it works from the repo root
#
# The machine needs jax, flax, optax and orbax-checkpoint installed (an accelerator build: they
# are used as they are, never replaced) and needs no package registry: a module that is missing
# (libcst, pytest, ...) is installed from the wheels in benchmarks/wheels/ (made by
# benchmarks/device_wheels.sh) into a temporary folder, with --no-index. This package itself is
# imported from the tree (PYTHONPATH); the tests run the CLI in-process, not as `linen2nnx`.
#
# $OUT gets at most 8 files (what the device tool brings back): environment.txt (versions,
# devices, installs), parity.txt and parity.xml (pytest output, JUnit XML), steps.txt and
# bridge_step.txt (benchmark tables; the figures that matter are the ratios against the Linen
# baseline of the same run), summary.txt (pass/fail counts, wall times, the tables).
# Each stage runs under `timeout` and a failed stage does not stop the next one. Exits nonzero
# when the parity stage did not pass.
#
# A TPU admits one process at a time: there the parity suite runs in pytest's own process (-n 0),
# elsewhere in 8 workers. benchmarks/device_parity.py (run it after this script, with
# PYTHONPATH=$TMPDIR/linen2nnx-device-site for what was installed here) records the demo, verify and
# checkpoint round trips at both matmul precisions, side by side with the CPU.
#
# Knobs (environment): PYTHON (default python3), PARITY_WORKERS (8; 0 on a TPU), PARITY_BUDGET_S (240),
# STEPS_BUDGET_S (120: steps.py also times scanned-layer compiles), BENCH_BUDGET_S (75, bridge_step.py),
# BENCH_STEPS (500), BENCH_REPEATS (5), TOTAL_BUDGET_S (450).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$SECONDS
DEADLINE=$((START + ${TOTAL_BUDGET_S:-450}))  # 7.5 minutes: the rest of 8 is for the summary

OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
WHEELS=$ROOT/benchmarks/wheels
SITE=${TMPDIR:-/tmp}/linen2nnx-device-site

# On a GPU, float32 matmuls and convolutions default to TF32 (about 10 bits of mantissa), which
# puts NNX-vs-Linen differences well above the parity suite's 1e-5-ish tolerances. Ask XLA for
# full float32 precision, and tell cuBLAS/cuDNN not to use TF32 behind its back.
export JAX_DEFAULT_MATMUL_PRECISION=highest
export NVIDIA_TF32_OVERRIDE=0
# Several pytest workers share the one GPU: allocate on demand instead of 75% per process.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1
# codemods and nnx_bridge import from the tree; $SITE holds what gets installed below.
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}

declare -A RC WALL
STAGES=()

# run_stage NAME BUDGET_S COMMAND...: output to the terminal and $OUT/NAME.txt; records the exit
# status (124: out of time) and wall time. SIGINT at the deadline, so pytest still writes its
# summary and JUnit file; SIGKILL 15 s later.
run_stage() {
  local name=$1 budget=$2 left start rc
  shift 2
  STAGES+=("$name")
  left=$((DEADLINE - SECONDS))
  ((budget > left)) && budget=$left
  if ((budget < 15)); then
    echo "[$name] skipped: the 8-minute budget is spent" | tee "$OUT/$name.txt"
    RC[$name]=skipped WALL[$name]=0
    return 0
  fi
  echo "[$name] $* (timeout ${budget}s)"
  start=$SECONDS
  set +e
  { echo "\$ $*"; timeout -s INT -k 15 "$budget" "$@"; } 2>&1 | tee "$OUT/$name.txt"
  rc=${PIPESTATUS[0]}
  set -e
  RC[$name]=$rc WALL[$name]=$((SECONDS - start))
  echo "[$name] exit $rc after ${WALL[$name]}s"
  return 0
}

# --- environment and installs -> environment.txt -------------------------------------------
ENV_FILE=$OUT/environment.txt
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  python: $(command -v "$PYTHON")"
  echo "JAX_DEFAULT_MATMUL_PRECISION=$JAX_DEFAULT_MATMUL_PRECISION NVIDIA_TF32_OVERRIDE=$NVIDIA_TF32_OVERRIDE XLA_PYTHON_CLIENT_PREALLOCATE=$XLA_PYTHON_CLIENT_PREALLOCATE"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PYTHON" --version
} >"$ENV_FILE" 2>&1 || true

# module -> distribution: what the codemod, the tests and pytest -n need beyond the JAX stack.
declare -A DIST=([libcst]=libcst [yaml]=pyyaml [pathspec]=pathspec [tqdm]=tqdm [pytest]=pytest
  [xdist]=pytest-xdist [execnet]=execnet [iniconfig]=iniconfig [packaging]=packaging
  [pluggy]=pluggy [pygments]=pygments [pyflakes]=pyflakes)
rm -rf "$SITE"
missing=()
for module in "${!DIST[@]}"; do
  "$PYTHON" -c "import $module" 2>/dev/null || missing+=("${DIST[$module]}")
done
INSTALL_RC=0
if ((${#missing[@]})); then
  echo "installing from $WHEELS (--no-index): ${missing[*]}" >>"$ENV_FILE"
  # --target: nothing in the interpreter's own environment changes, and --no-deps: nothing
  # (least of all jax) gets replaced or pulled in. The device's pip config is ignored.
  PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    --no-index --no-deps --no-compile --no-cache-dir --find-links "$WHEELS" --target "$SITE" \
    "${missing[@]}" >>"$ENV_FILE" 2>&1 || INSTALL_RC=$?
  ((INSTALL_RC)) && echo "install FAILED (exit $INSTALL_RC): did benchmarks/wheels travel (carry)," \
    "and was device_wheels.sh run with this Python's --python-version?" >>"$ENV_FILE"
else
  echo "nothing to install: all of ${DIST[*]} import" >>"$ENV_FILE"
fi

"$PYTHON" - >>"$ENV_FILE" 2>&1 <<'EOF' || echo "jax does not import or has no devices" >>"$ENV_FILE"
import importlib.metadata as metadata
import jax
print('jax', jax.__version__, jax.devices())
print('default backend:', jax.default_backend())
for name in ['jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'libcst', 'numpy', 'pytest', 'pytest-xdist']:
  try:
    print(f'{name} {metadata.version(name)}')
  except metadata.PackageNotFoundError:
    print(f'{name} not installed')
EOF
cat "$ENV_FILE"

# --- (a) the parity suite --------------------------------------------------------------------
# Numeric equivalence of Linen and NNX: parity checks, state transfer, the derived leaf mapping,
# the bridge both ways, every layer-table row, and every migration rule's before/after run.
# `slow` tests are the end-to-end ones (subprocesses pinned to CPU); they add nothing here.
PARITY_TESTS=(tests/nnx_bridge tests/codemods/rules)
BACKEND=$(sed -n 's/^default backend: //p' "$ENV_FILE")
DEFAULT_WORKERS=8
[[ $BACKEND == tpu ]] && DEFAULT_WORKERS=0  # one process holds the chip: no workers, the tests run in pytest's own
echo "backend: ${BACKEND:-unknown}, pytest workers: ${PARITY_WORKERS:-$DEFAULT_WORKERS}" | tee -a "$ENV_FILE"
run_stage parity "${PARITY_BUDGET_S:-240}" "$PYTHON" -m pytest -q -p no:cacheprovider \
  -n "${PARITY_WORKERS:-$DEFAULT_WORKERS}" -m "not slow" --maxfail=10 -rfE --durations=15 \
  --junitxml="$OUT/parity.xml" -o junit_family=xunit2 "${PARITY_TESTS[@]}"

# --- (b) the benchmarks -----------------------------------------------------------------------
BENCH_ARGS=(--steps "${BENCH_STEPS:-500}" --repeats "${BENCH_REPEATS:-5}")
run_stage steps "${STEPS_BUDGET_S:-120}" "$PYTHON" benchmarks/steps.py "${BENCH_ARGS[@]}"
run_stage bridge_step "${BENCH_BUDGET_S:-75}" "$PYTHON" benchmarks/bridge_step.py "${BENCH_ARGS[@]}"

# --- (c) summary.txt ---------------------------------------------------------------------------
counts=$("$PYTHON" - "$OUT/parity.xml" 2>/dev/null <<'EOF'
import sys
import xml.etree.ElementTree as ET
suites = ET.parse(sys.argv[1]).getroot()
suites = [suites] if suites.tag == 'testsuite' else list(suites)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ('tests', 'failures', 'errors', 'skipped')}
passed = n['tests'] - n['failures'] - n['errors'] - n['skipped']
print(f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
EOF
) || counts='no JUnit file (pytest did not get far enough to write one)'

status() {  # status NAME -> pass / FAIL (exit N) / TIMEOUT / skipped
  case ${RC[$1]} in
    0) echo pass ;;
    124) echo "TIMEOUT" ;;
    skipped) echo skipped ;;
    *) echo "FAIL (exit ${RC[$1]})" ;;
  esac
}
{
  echo "device_check.sh on $(hostname), $(date -u +%FT%TZ)"
  grep -E '^(jax|default backend|flax|optax|orbax-checkpoint|libcst) ' "$ENV_FILE" || true
  ((INSTALL_RC)) && echo "install from benchmarks/wheels FAILED (exit $INSTALL_RC)"
  echo
  printf '%-12s %-16s %6s\n' stage result wall_s
  for name in "${STAGES[@]}"; do
    printf '%-12s %-16s %6s\n' "$name" "$(status "$name")" "${WALL[$name]}"
  done
  printf '%-12s %-16s %6s\n' total '' $((SECONDS - START))
  echo
  echo "parity: $counts"
  for name in steps bridge_step; do
    echo
    echo "== $name (us/step; the ratios against Linen are what to compare) =="
    grep -vE '^\$ ' "$OUT/$name.txt" | tail -n 12
  done
} >"$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
echo "results in $OUT"
[[ ${RC[parity]} == 0 ]]
