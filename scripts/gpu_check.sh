#!/usr/bin/env bash
# On a CUDA machine with torch preinstalled and no network: build the extensions in place, run
# the GPU tests and the benchmarks, and print a short table last.
#
#   bash scripts/gpu_check.sh [build] [test] [bench] [host] [tune] [profile] [e2e] [replay]
#                             [uneven] [calibrate] [memory] [train_memory] [diffsynth_step]
#                             [hostprof] [mix] [convergence] [families] [rms] [sp] [share]
#                             [fidelity] [sampler] [keep]
#                                                             (default: build test bench host)
#
# Results go to $OUT (or ./out): logs, and the benchmarks' CSVs (copy them to
# benchmarks/results/<gpu>/ and run benchmarks/make_results.py). The device brings back only a
# few files a call: point OUT elsewhere and tar it into the device's $OUT. TORCH_CUDA_ARCH_LIST
# defaults to 9.0 (H100/H200) here to keep the build short. Python wheels carried in .whl/
# (packages the machine lacks, such as diffusers) are installed to /tmp/site first.
#
# BASELINE=DIR: a checkout of another revision (e.g. main before a change) built beside this one
# (in the background, from the start); `bench` and `host` then measure it too, in the same run,
# labelled "baseline".
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
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BASELINE=${BASELINE:-}
steps=${*:-build test bench host}
status=0
summary=()

run_step() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  if "$@" > "$OUT/$name.log" 2>&1; then
    summary+=("$(printf '%-14s ok     %4ds' "$name" $((SECONDS - t0)))")
  else
    summary+=("$(printf '%-14s FAILED %4ds  (see %s.log)' "$name" $((SECONDS - t0)) "$name")")
    status=1
  fi
  tail -n 25 "$OUT/$name.log"
}

if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
fi
SITE=${PYTHONPATH:-}
ours() { PYTHONPATH=$PWD/python${SITE:+:$SITE} "$@"; }
baseline() { PYTHONPATH=$BASELINE/python${SITE:+:$SITE} "$@"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

baseline_pid=
if [ -n "$BASELINE" ] && [[ " $steps " == *" build "* ]]; then
  # One core is all a single-file build can use; it runs while ours builds and tests.
  (cd "$BASELINE" && MAX_JOBS=1 $PY setup.py build_ext --inplace) > "$OUT/build_baseline.log" 2>&1 &
  baseline_pid=$!
fi
wait_baseline() {
  if [ -n "$baseline_pid" ]; then
    local t0=$SECONDS
    if wait "$baseline_pid"; then
      summary+=("$(printf '%-14s ok   +%4ds' build_baseline $((SECONDS - t0)))")
    else
      summary+=("$(printf '%-14s FAILED' build_baseline)"); status=1; BASELINE=
    fi
    baseline_pid=
  fi
}

for step in $steps; do
  case $step in
    build)
      run_step build $PY setup.py build_ext --inplace
      run_step smoke ours $PY - <<'PY'
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
    sampler)
      # The sampler's binding alone (about 20 s on 16 cores, against about 2 minutes for
      # `build`): enough for the benchmarks that time or train diffusers' blocks without the
      # fused ops (fidelity, sp). Each file compiles in a process of its own.
      run_step sampler bash -c '
        set -e; objs=/tmp/sampler_objs; mkdir -p "$objs"
        flags="-O3 -fPIC -std=c++17 -Icsrc $('"$PY"' -m pybind11 --includes)"
        ls csrc/sampler/*.cpp csrc/bindings/*.cpp | xargs -P "$MAX_JOBS" -I{} \
          sh -c "c++ $flags -c {} -o $objs/\$(basename {} .cpp).o"
        suffix=$('"$PY"' -c "import sysconfig; print(sysconfig.get_config_var(\"EXT_SUFFIX\"))")
        c++ -shared "$objs"/*.o -o "python/adaptiveload/_sampler$suffix"
        PYTHONPATH=python '"$PY"' -c "import adaptiveload._sampler as s; print(\"sampler built:\", s.__file__)"'
      ;;
    test)
      # The CPU-only suites run in CI; here the ones with CUDA cases.
      # TEST_ARGS is split like a shell line, so quoted -k expressions work.
      eval "extra=(${TEST_ARGS:-})"
      run_step test ours timeout "${TEST_TIMEOUT:-420}" $PY -m pytest tests/python/test_ops.py tests/python/test_ops_properties.py tests/python/test_ops_tables.py tests/python/test_ops_cuda.py \
        tests/python/test_wan_integration.py tests/python/test_split_sequence.py -q -rs -p no:cacheprovider "${extra[@]}"
      ;;
    bench)
      eval "extra=(${BENCH_ARGS:---no-compile})"
      run_step bench ours timeout "${BENCH_TIMEOUT:-400}" $PY benchmarks/bench_layer_norm_modulate.py \
        --csv "$OUT/layer_norm_modulate.csv" --label ours "${extra[@]}"
      wait_baseline
      if [ -n "$BASELINE" ]; then
        run_step bench_baseline baseline timeout "${BENCH_TIMEOUT:-400}" $PY \
          benchmarks/bench_layer_norm_modulate.py --csv "$OUT/layer_norm_modulate.csv" \
          --label baseline "${extra[@]}"
      fi
      ;;
    rms)
      # Issue 27: rms_norm_modulate at LTX-Video's shapes against torch.compile and Liger-Kernel.
      eval "extra=(${RMS_ARGS:-})"
      run_step rms ours timeout "${RMS_TIMEOUT:-360}" $PY benchmarks/bench_rms_norm_modulate.py \
        --csv "$OUT/rms_norm_modulate.csv" --label ours "${extra[@]}"
      ;;
    host)
      run_step host ours $PY benchmarks/bench_host_overhead.py --csv "$OUT/host_overhead.csv" --label ours ${HOST_ARGS:-}
      wait_baseline
      if [ -n "$BASELINE" ]; then
        run_step host_baseline baseline $PY benchmarks/bench_host_overhead.py \
          --csv "$OUT/host_overhead.csv" --label baseline
      fi
      ;;
    tune)
      run_step tune ours timeout "${TUNE_TIMEOUT:-400}" $PY benchmarks/tune_layer_norm_modulate.py \
        --csv "$OUT/tune.csv" ${TUNE_ARGS:-}
      ;;
    profile)
      # Hardware counters of our kernels (Nsight Compute; works on the Firecracker machines).
      # PROFILE_CACHE=none keeps the L2 as the previous kernel left it (ncu flushes it by default).
      run_step profile ours timeout "${PROFILE_TIMEOUT:-240}" ncu --profile-from-start off \
        --cache-control "${PROFILE_CACHE:-all}" --clock-control none \
        -k 'regex:layer_norm_modulate|reduce_partials|elementwise' --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section InstructionStats \
        $PY benchmarks/profile_layer_norm_modulate.py ${PROFILE_ARGS:-}
      ;;
    e2e)
      eval "extra=(${E2E_ARGS:-})"
      run_step e2e ours timeout "${E2E_TIMEOUT:-420}" $PY benchmarks/e2e_wan.py --out "$OUT/e2e" "${extra[@]}"
      ;;
    replay)
      # The one-GPU replay of many ranks (benchmarks/replay_wan.py; issue 15).
      eval "extra=(${REPLAY_ARGS:-})"
      run_step replay ours timeout "${REPLAY_TIMEOUT:-420}" $PY benchmarks/replay_wan.py \
        --out "$OUT/replay" "${extra[@]}"
      ;;
    uneven)
      # Issue 18: uneven micro-batch counts per rank against K per rank, W = 8, K = 4, with one
      # sample per micro-batch and with the mixed plan (benchmarks/replay_wan.py --uneven).
      run_step uneven_b1 ours timeout "${UNEVEN_TIMEOUT:-240}" $PY benchmarks/replay_wan.py \
        --uneven --worlds 8 --ks 4 --max-batch-size 1 --out "$OUT/uneven_b1"
      run_step uneven ours timeout "${UNEVEN_TIMEOUT:-240}" $PY benchmarks/replay_wan.py \
        --uneven --worlds 8 --ks 4 --out "$OUT/uneven"
      ;;
    share)
      # Issue 35: one member's share of a split micro-batch against the whole, cross-attention
      # on the token shard and on head shards (benchmarks/bench_split_share.py).
      run_step share ours timeout "${SHARE_TIMEOUT:-300}" $PY benchmarks/bench_split_share.py \
        --out "$OUT/share"
      ;;
    sp)
      # Issue 35: sequence parallelism per micro-batch, replayed (benchmarks/replay_sp.py):
      # every arm calibrated plan-aware on its own epoch 0, scored on epoch 1.
      eval "extra=(${SP_ARGS:-})"
      run_step sp ours timeout "${SP_TIMEOUT:-540}" $PY benchmarks/replay_sp.py \
        --out "$OUT/sp" "${extra[@]}"
      ;;
    keep)
      # The built extensions, stripped, back through $OUT (in pieces of 15 MiB where larger),
      # to carry into the next call: cat the pieces back into python/adaptiveload/.
      for so in python/adaptiveload/*.so; do
        strip --strip-debug "$so"
        split -b 15M -d "$so" "$OUT/$(basename "$so")."
      done
      ls -la "$OUT"/*.so.*
      ;;
    mix)
      # Issue 25: the mix_tolerance frontier, replayed (benchmarks/replay_mix.py).
      eval "extra=(${MIX_ARGS:-})"
      run_step mix ours timeout "${MIX_TIMEOUT:-300}" $PY benchmarks/replay_mix.py \
        --out "$OUT/mix" "${extra[@]}"
      ;;
    convergence)
      # Issue 34: does the step order change what the model learns (benchmarks/convergence_wan.py)?
      # The full run is 10 seeds, too long for one call: each call runs the slice
      # CONVERGENCE_ARGS names (--seeds 0-4, then --seeds 5-9), on the host's CPU cores (one
      # run per core: this toy's passes are overhead-bound on either device, and CPU runs
      # scale with the cores), and starts no run after CONVERGENCE_BUDGET seconds. Merge the
      # slices' folders with convergence_wan.py --summarize-only.
      eval "extra=(${CONVERGENCE_ARGS:-})"
      run_step convergence ours timeout "${CONVERGENCE_TIMEOUT:-560}" $PY \
        benchmarks/convergence_wan.py --out-dir "$OUT/convergence" \
        --time-budget "${CONVERGENCE_BUDGET:-430}" "${extra[@]}"
      ;;
    fidelity)
      # Issue 54: does the balanced plan train as well as a shuffle (benchmarks/fidelity.py)?
      # 4 to 12 seeds at about 3.5 minutes a seed of every run (H100, 8 workers): each call runs
      # the slice of seeds FIDELITY_ARGS names (--seeds 0-1, then the range --summarize-only
      # prints as "next: --seeds A-B"), or, once the first 4 seeds are in, only the comparisons
      # still pending, round after round (--continue benchmarks/results/h100/fidelity_slices/*:
      # new slices under $OUT/fidelity/seedsA-B), and starts no run after FIDELITY_BUDGET
      # seconds. Merge the slices' folders with fidelity.py --summarize-only DIR [DIR ...].
      # FIDELITY_WORKERS runs share the GPU at once (8 unless told; 14 ran an 80 GB H100 out of
      # memory).
      eval "extra=(${FIDELITY_ARGS:---seeds 0-1})"
      run_step fidelity ours timeout "${FIDELITY_TIMEOUT:-560}" $PY benchmarks/fidelity.py \
        --device cuda --out-dir "$OUT/fidelity" --time-budget "${FIDELITY_BUDGET:-450}" \
        --workers "${FIDELITY_WORKERS:-8}" "${extra[@]}"
      ;;
    calibrate)
      # Plan-aware calibration of the full-depth model, timed (issue 15's <= 10 minutes).
      eval "extra=(${CALIBRATE_ARGS:---layers 30 --worlds 8 --ks 1})"
      run_step calibrate ours timeout "${CALIBRATE_TIMEOUT:-540}" $PY benchmarks/replay_wan.py \
        --calibration-only --out "$OUT/calibrate" "${extra[@]}"
      ;;
    memory)
      # Issue 16: the checkpointing policy in the replay (writes its memory model, memory.json).
      eval "extra=(${MEMORY_ARGS:-})"
      run_step replay_memory ours timeout "${MEMORY_TIMEOUT:-420}" $PY benchmarks/replay_memory.py \
        --out "$OUT/replay_memory" "${extra[@]}"
      ;;
    train_memory)
      # Issue 16: a real training run with the policy, from the replay's memory model
      # (MEMORY_MODEL=file, default the memory step's): a budget at which the plan's largest
      # micro-batches need about half their blocks checkpointed, plus AdamW's state.
      mm=${MEMORY_MODEL:-$OUT/replay_memory/memory.json}
      ours $PY examples/make_synthetic_latents.py --out /tmp/wan_mem_data --num-samples 800 \
        --mix joint-pretrain --scale 0.5 > "$OUT/make_data.log" 2>&1
      budget=$(ours $PY - "$mm" /tmp/wan_mem_data <<'PY'
import sys
from adaptiveload import MemoryModel
from adaptiveload.metadata import read_metadata
m = MemoryModel.load(sys.argv[1])
longest = int(read_metadata(sys.argv[2] + "/metadata.csv").seq_lens.max())
adam = 8 * 1.3e9 * m.num_blocks / 30 / 2**30 * 1.1  # AdamW state of the short 1.3B, rounded up
print(round(m.peak_bytes([2 * longest], m.num_blocks // 2) * (1 + m.margin) / 2**30 + adam, 2))
PY
)
      echo "training budget: $budget GiB"
      run_step train_memory ours timeout "${TRAIN_TIMEOUT:-300}" $PY examples/train_wan.py \
        --data /tmp/wan_mem_data --layers 6 --memory-model "$mm" \
        --memory-budget "$budget" --max-steps "${TRAIN_STEPS:-300}" --epochs 100 --no-progress \
        --log-file "$OUT/train_memory.jsonl" --num-workers 4 --warm-shapes
      ;;
    diffsynth_step)
      # Issue 18: the fused ops' share of a DiffSynth Wan training step (diffsynth carried as a
      # wheel in .whl/; its model module loads without the package's data-pipeline imports).
      run_step diffsynth_step ours timeout "${DIFFSYNTH_TIMEOUT:-120}" $PY \
        benchmarks/diffsynth_step.py --csv "$OUT/diffsynth_step.csv" ${DIFFSYNTH_ARGS:-}
      ;;
    families)
      # Issue 27: the family adapters on CUDA (parity of the patched models), the fused ops'
      # share of a training step per family, and a replay of HunyuanVideo and LTX-Video.
      run_step families_test ours timeout "${FAMILIES_TEST_TIMEOUT:-300}" $PY -m pytest \
        tests/python/test_families.py -q -rs -p no:cacheprovider -m "not slow"
      run_step family_step ours timeout "${FAMILY_STEP_TIMEOUT:-240}" $PY \
        benchmarks/family_step.py --csv "$OUT/family_step.csv"
      eval "extra=(${FAMILY_REPLAY_ARGS:---worlds 8 --samples 20000 --refine-epochs 1})"
      run_step replay_hunyuanvideo ours timeout "${FAMILY_REPLAY_TIMEOUT:-420}" $PY \
        benchmarks/replay_wan.py --model hunyuanvideo/hunyuanvideo-13B --layers 1 --ks 4 \
        --out "$OUT/replay_hunyuanvideo" "${extra[@]}"
      run_step replay_ltx ours timeout "${FAMILY_REPLAY_TIMEOUT:-420}" $PY \
        benchmarks/replay_wan.py --model ltx-video/ltx-video-2B --mix held-out-ltx --layers 2 --ks 1,4 \
        --out "$OUT/replay_ltx" "${extra[@]}"
      ;;
    hostprof)
      # Issue 17: where the host time of forward+backward goes (torch.profiler, tiny tensors).
      run_step hostprof ours $PY benchmarks/profile_host.py
      ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
wait_baseline

echo
echo "=== summary ($(date -u +%F' '%H:%M) UTC, $(head -n1 "$OUT/gpu.txt"))"
printf '%s\n' "${summary[@]}"
if [ -f "$OUT/layer_norm_modulate.csv" ]; then
  $PY - "$OUT/layer_norm_modulate.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["impl"] == "ours"]
labels = sorted({r["label"] for r in rows})
print("\n% of copy bandwidth (ours), by build: " + ", ".join(labels))
by = {(r["shape"], r["label"]): r for r in rows}
for shape in dict.fromkeys(r["shape"] for r in rows):
    cells = []
    for lab in labels:
        r = by.get((shape, lab))
        cells.append(f"{lab} fwd {float(r['fwd_pct']):5.1f} bwd {float(r['bwd_pct']):5.1f}" if r else f"{lab} -")
    print(f"  {shape:<30} " + " | ".join(cells))
PY
fi
[ -f "$OUT/host_overhead.csv" ] && cat "$OUT/host_overhead.csv"
exit $status
