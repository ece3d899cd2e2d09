#!/usr/bin/env bash
# On a CUDA machine with torch preinstalled and no network: build the extensions in
# place, run the GPU tests and the benchmarks, and print a short table last.
#
#   bash scripts/gpu_check.sh [build] [test] [sweep] [bench] [profile] [e2e]   (default: build test bench)
#
# Logs and result tables go to $OUT (or ./out). TORCH_CUDA_ARCH_LIST defaults to 9.0
# (H100/H200) here to keep the build short. Python wheels carried in .whl/ (packages the
# machine lacks, such as diffusers) are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# Build with the system compiler, whose libstdc++ is the one the process loads: on the GPU
# machine CC/CXX point to a newer GCC, and an extension built with it crashed inside
# std::ostream while formatting an error message (TORCH_CHECK).
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
steps=${*:-build test bench}
status=0
summary=()

run_step() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  if "$@" > "$OUT/$name.log" 2>&1; then
    summary+=("$(printf '%-10s ok     %4ds' "$name" $((SECONDS - t0)))")
  else
    summary+=("$(printf '%-10s FAILED %4ds  (see %s.log)' "$name" $((SECONDS - t0)) "$name")")
    status=1
  fi
  tail -n 25 "$OUT/$name.log"
}

if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

for step in $steps; do
  case $step in
    build)
      run_step build $PY setup.py build_ext --inplace
      run_step smoke $PY - <<'PY'
import torch, adaptiveload
from adaptiveload import layer_norm_modulate
print("adaptiveload", adaptiveload.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
x = torch.randn(4, 256, 1536, device="cuda", dtype=torch.bfloat16)
shift, scale = (torch.randn(4, 1, 1536, device="cuda") for _ in range(2))
y = layer_norm_modulate(x, shift, scale)
ref = torch.nn.functional.layer_norm(x.float(), (1536,), eps=1e-6) * (1 + scale) + shift
print("layer_norm_modulate on", y.device, "max abs err vs fp32 reference:", (y.float() - ref).abs().max().item())
PY
      ;;
    test)
      # The CPU-only suites run in CI; here the ones with CUDA cases.
      # TEST_ARGS is split like a shell line, so quoted -k expressions work.
      eval "extra=(${TEST_ARGS:-})"
      run_step test timeout "${TEST_TIMEOUT:-400}" $PY -m pytest tests/python/test_ops.py tests/python/test_wan_integration.py \
        -q -rs -p no:cacheprovider "${extra[@]}"
      ;;
    bench)
      eval "extra=(${BENCH_ARGS:-})"
      run_step bench timeout "${BENCH_TIMEOUT:-400}" $PY benchmarks/bench_layer_norm_modulate.py \
        --out "$OUT/ops_results.md" "${extra[@]}"
      ;;
    sweep)
      run_step sweep timeout "${SWEEP_TIMEOUT:-240}" $PY benchmarks/bench_layer_norm_modulate.py \
        --sweep --out "$OUT/sweep.md"
      ;;
    profile)
      # Hardware counters of our kernels (Nsight Compute; works on the Firecracker machines).
      # PROFILE_CACHE=none keeps the L2 as the previous kernel left it (ncu flushes it by default).
      run_step profile timeout "${PROFILE_TIMEOUT:-240}" ncu --profile-from-start off \
        --cache-control "${PROFILE_CACHE:-all}" --clock-control none \
        -k 'regex:layer_norm_modulate|reduce_partials|copy|elementwise' --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section SchedulerStats --section WarpStateStats --section InstructionStats \
        --section SourceCounters \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        $PY benchmarks/profile_layer_norm_modulate.py ${PROFILE_ARGS:-}
      ;;
    e2e)
      eval "extra=(${E2E_ARGS:-})"
      run_step e2e timeout "${E2E_TIMEOUT:-420}" $PY benchmarks/e2e_wan.py --out "$OUT/e2e" "${extra[@]}"
      ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done

echo
echo "=== summary ($(date -u +%F' '%H:%M) UTC, $(head -n1 "$OUT/gpu.txt"))"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/sweep.md" ] && cat "$OUT/sweep.md"
[ -f "$OUT/ops_results.md" ] && tail -n 40 "$OUT/ops_results.md"
exit $status
