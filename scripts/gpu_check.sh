#!/usr/bin/env bash
# Everything GPU, in parts that each fit one 600 s device call. Every part installs opsmith
# (with its C launcher), runs its pieces with their logs and JSON under a work directory, packs
# them into $OUT/<part>.tgz (a device call returns at most 8 files) and prints a short table last.
#   bash scripts/gpu_check.sh tests    the gpu-marked tests but opsmith.ops' (the ops part): NVRTC
#                                      kernels, C launcher, nvcc extensions, torch ops
#                                      (opsmith.custom_op), export-c (example on each device), ONNX
#                                      Runtime
#   bash scripts/gpu_check.sh bench    op-call overhead, export-c launch cost, opsmith.ops sweep
#                                      (OPS_BENCH=0 skips it), the kernel benchmark, the compile
#                                      cache (COMPILE_CACHE_BENCH=0 skips), ONNX Runtime's CPU relu
#                                      on the host's cores (ORT_BENCH=0 skips) and the demo
#   bash scripts/gpu_check.sh autograd the torch-op tests, opsmith.ops' tests (C++ kernels included) and
#                                      bench/bench_op_autograd.py, bench/bench_op_overhead.py
#   bash scripts/gpu_check.sh peers    issue 23: tests/ops/test_ops_gated_gpu.py, bench/bench_ops_peers.py (Liger from
#                                      .whlp/, carried), bench/bench_llama_step.py
#   bash scripts/gpu_check.sh ops      issue 23: every opsmith.ops GPU test, then bench/bench_ops_peers.py (PEERS_ARGS)
#   bash scripts/gpu_check.sh package  issue 21: scripts/gpu_check_package.sh (wheels, zero compiles, import time)
#   bash scripts/gpu_check.sh kernels|ext   the earlier parts (scripts/gpu_check_kernels.sh, _cuda_ext.sh)
set -uo pipefail
PART=${1:-tests}; shift || true
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; mkdir -p "$OUT"
W=$(mktemp -d); L="$W/$PART"; mkdir -p "$L"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -V
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } 2>&1 | tee "$L/versions.txt"
python3 -m pip install --no-deps --no-build-isolation -e . >"$L/pip.log" 2>&1 || { tail -20 "$L/pip.log"; exit 1; }
python3 -m compileall -q opsmith >/dev/null
python3 -c "import opsmith._runtime._claunch as c; print('C launcher:', c.__file__)" 2>&1 | tee -a "$L/versions.txt"
declare -A RC
run() {  # run NAME CMD...: log to $L/NAME.log, remember the exit status
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$L/$name.log" 2>&1; RC[$name]=$?
  echo "$name rc=${RC[$name]} $((SECONDS - t0))s" >>"$L/status.txt"
}
case "$PART" in
  tests)
    run kernels python3 -m pytest -q -p no:cacheprovider -rs tests/build/test_nvrtc.py tests/torch/test_kernel_args.py \
      tests/torch/test_kernel_gpu.py tests/runtime/test_claunch.py
    run cuda_ext python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/torch/test_cuda_ext_gpu.py tests/cli/test_doctor.py \
      tests/build/test_nvcc_split.py
    run torch_ops python3 -m pytest -q -p no:cacheprovider -rs tests/torch/test_torch_ops.py tests/torch/test_torch_ops_gpu.py \
      tests/torch/test_torch_ops_cshim.py tests/torch/test_torch_ops_cshim_gpu.py tests/torch/test_op_autograd.py
    # opsmith.ops' GPU tests run in the ops part (with them all, this part ran past 600 s on an H200)
    for f in tests/export_c/test_export_c_gpu.py tests/onnx/test_onnx_ort_gpu.py; do
      [ -f "$f" ] && run "$(basename "$f" .py)" python3 -m pytest -q -p no:cacheprovider -rs "$f"
    done
    if [ -x examples/export_c/build.sh ]; then
      run export_c_example_build examples/export_c/build.sh "$W/example"
      for d in $(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 ))); do run "export_c_example_dev$d" "$W/example/example" "$d"; done
    fi
    ;;
  bench)
    [ -f bench/bench_op_overhead.py ] && run bench_op_overhead python3 bench/bench_op_overhead.py --json "$L/bench_op_overhead.json"
    [ -f bench/bench_export_c_launch.py ] && run bench_export_c python3 bench/bench_export_c_launch.py --out "$L/bench_export_c.json"
    [ -f bench/bench_ops.py ] && [ "${OPS_BENCH:-1}" != 0 ] && run bench_ops python3 bench/bench_ops.py --out "$L/ops" ${OPS_BENCH_ARGS:-}
    run bench_kernels python3 bench/bench_kernels.py --out "$L/bench_kernels.json" --skip-torch-ext
    [ "${COMPILE_CACHE_BENCH:-1}" != 0 ] && run bench_compile_cache python3 bench/bench_compile_cache.py --out "$L/bench_compile_cache.json"
    [ "${ORT_BENCH:-1}" != 0 ] && run bench_ort_cpu python3 bench/bench_ort.py --device cpu --sizes 4096,67108864 --json "$L/bench_ort_cpu.json"
    OPSMITH_CACHE_DIR=$(mktemp -d) run demo opsmith demo
    ;;
  autograd)  # issue 20: native Autograd kernels, scalars on the C path, opsmith.ops on both; its benchmark
    run torch_ops python3 -m pytest -q -p no:cacheprovider -rs tests/torch/test_torch_ops.py tests/torch/test_torch_ops_gpu.py \
      tests/torch/test_torch_ops_cshim.py tests/torch/test_torch_ops_cshim_gpu.py tests/torch/test_op_autograd.py
    run ops python3 -m pytest -q -p no:cacheprovider -rs -x tests/ops/test_ops_native_gpu.py tests/ops/test_ops_native.py \
      tests/ops/test_ops_gpu.py tests/ops/test_ops_gated_gpu.py tests/ops/test_ops_fused_gpu.py tests/ops/test_ops_rotary_gpu.py \
      tests/ops/test_ops_cross_entropy_gpu.py tests/ops/test_ops_compile.py
    run bench_op_autograd python3 bench/bench_op_autograd.py --json "$L/bench_op_autograd.json"
    run bench_op_overhead python3 bench/bench_op_overhead.py --json "$L/bench_op_overhead.json"
    ;;
  peers|ops)  # issue 23. peers: the new ops on CUDA; opsmith.ops against eager, compile(dynamic=False) and Liger;
    # the Llama step. ops: every opsmith.ops GPU test (C++ kernels included), then the peers benchmark alone
    # (PEERS_ARGS, e.g. "--ops rms_norm,rotary --budget-s 150"; TESTS_K: a pytest -k expression;
    # DIAG_CLUSTER=1: bench/diag_norm_cluster.py first, the norms' cluster kernels against the long ones;
    # DIAG_BWD_C4=1: bench/diag_norm_bwd_c4.py (BWD_C4_ARGS), the norm backwards at 4 chunks against the clusters;
    # DIAG_C4=1: bench/diag_fwd_c4.py first, the row forwards of 4 chunks a thread against 2; DIAG_LONG1=1:
    # bench/diag_fwd_long1.py, the 32/64 KiB rows at 8 chunks (add_rms_norm's too) against the L2 rows;
    # DIAG_128K=1: bench/diag_fwd_128k.py, the 64-128 KiB rows: the L2 plan against its variants; DIAG_TRIPS=1:
    # bench/diag_fwd_l2_trips.py, the 16-64 KiB L2 rows at 2 and 4 chunks a trip, 2 to 4 blocks an SM;
    # DIAG_SMALL_BWD=1: bench/diag_small_bwd_one.py, the one-launch small norm backwards; DIAG_BWD_ORDER=1:
    # bench/diag_bwd_order.py, the backwards' row order; DIAG_SOFTMAX_FULL=1: bench/diag_softmax_full.py; DIAG_FULL_ROWS=1:
    # bench/diag_full_rows.py --bounds (or FULL_ROWS_ARGS), the full-row forwards at 2 and 4 chunks and tighter register
    # caps; DIAG_ADD_RMS=1: bench/diag_add_rms_full.py, add_rms_norm's full-row variants; DIAG_SOFTMAX_STEP=1:
    # bench/diag_softmax_step.py (STEP_ARGS), softmax's fwd + bwd step by kernel beside Liger's; DIAG_NORM_WW=1:
    # bench/diag_norm_whole_warps.py, the norms' c4 forwards and backwards at exactly their threads; DIAG_NORM_REGS=1:
    # bench/diag_norm_bwd_regs.py (REGS_ARGS), the register-row norm backwards at fewer registers; DIAG_SMALL=1:
    # bench/diag_small_rows.py (SMALL_ARGS), the norm forwards at other chunks a thread beside compile;
    # DIAG_GATED_LARGE=1: bench/diag_gated_large.py (GATED_ARGS), the 16-bit gated forwards' variants beside Liger;
    # DIAG_GATED_STEP=1: bench/diag_gated_step.py (GATED_STEP_ARGS), the small gated fwd + bwd step by kernel;
    # DIAG_ROTARY=1: bench/diag_rotary.py (ROTARY_DIAG_ARGS; ROTARY_DIAG_ARGS2, _ARGS3: more runs), rotary_qk's launch
    # variants beside compile; NCU_ROTARY=1: Nsight Compute's sections on our rotary kernel and compile's (its --ncu);
    # DIAG_SOFTMAX_STAGED=1: bench/diag_softmax_staged.py, the float 32,768-row backward staged or in registers; after
    # the tests
    # DIAG_EW=1: bench/diag_ew_map.py, the elementwise maps beside eager; EW_BENCH=1: bench/bench_ops.py --quick;
    # ROTARY_IP=1: bench/bench_rotary_inplace.py, rotary in place beside out of place, compile and Liger;
    # AB_BEFORE=DIR: bench/diag_kernels_ab.py first, this tree's row kernels against DIR's (AB_ARGS);
    # PEERS=0 skips the peers benchmark, PEERS_ARGS2: a second peers run (its own dir, peers2/), TESTS=0 the tests,
    # TESTS_FILES: these test files in place of them all).
    # Liger-Kernel (pure Python over Triton) from its wheel, carried in .whlp/ (run with carry [".whlp"])
    if ls .whlp/liger_kernel-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-deps --target "$W/liger" .whlp/liger_kernel-*.whl >"$L/liger_pip.log" 2>&1 \
        && export PYTHONPATH="$W/liger${PYTHONPATH:+:$PYTHONPATH}"
    fi
    # transformers and the dependencies the GPU machine lacks, from wheels carried in .whlp/tf/
    # (bench/README.md): the Llama step's default model is transformers' LlamaForCausalLM
    if ls .whlp/tf/transformers-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-deps --target "$W/tf" .whlp/tf/*.whl >"$L/tf_pip.log" 2>&1 \
        && export PYTHONPATH="$W/tf${PYTHONPATH:+:$PYTHONPATH}"
    fi
    if [ "$PART" = ops ]; then
      [ "${DIAG_NORM:-0}" = 1 ] && run diag_norm python3 bench/diag_norm_occupancy.py --json "$L/diag_norm.json"
      [ "${DIAG_CLUSTER:-0}" = 1 ] && run diag_cluster python3 bench/diag_norm_cluster.py --json "$L/diag_cluster.json"
      [ "${DIAG_BWD_C4:-0}" = 1 ] && run diag_bwd_c4 python3 bench/diag_norm_bwd_c4.py --json "$L/diag_bwd_c4.json" ${BWD_C4_ARGS:---bf16}
      [ "${DIAG_C4:-0}" = 1 ] && run diag_c4 python3 bench/diag_fwd_c4.py --out "$L/diag_c4.json"
      [ "${DIAG_128K:-0}" = 1 ] && run diag_128k bash -c "cd bench && python3 diag_fwd_128k.py --out $L/diag_128k.json"
      [ "${DIAG_TRIPS:-0}" = 1 ] && run diag_trips bash -c "cd bench && python3 diag_fwd_l2_trips.py --out $L/diag_trips.json"
      [ "${DIAG_LONG1:-0}" = 1 ] && run diag_long1 python3 bench/diag_fwd_long1.py --out "$L/diag_long1.json"
      [ "${DIAG_SMALL_BWD:-0}" = 1 ] && run diag_small_bwd python3 bench/diag_small_bwd_one.py --json "$L/diag_small_bwd.json"
      [ "${DIAG_BWD_ORDER:-0}" = 1 ] && run diag_bwd_order python3 bench/diag_bwd_order.py --json "$L/diag_bwd_order.json"
      [ "${DIAG_SOFTMAX_FULL:-0}" = 1 ] && run diag_softmax_full python3 bench/diag_softmax_full.py --json "$L/diag_softmax_full.json"
      [ "${DIAG_FULL_ROWS:-0}" = 1 ] && run diag_full_rows bash -c "cd bench && python3 diag_full_rows.py ${FULL_ROWS_ARGS:---bounds} --json $L/diag_full_rows.json"
      [ "${DIAG_ADD_RMS:-0}" = 1 ] && run diag_add_rms bash -c "cd bench && python3 diag_add_rms_full.py --json $L/diag_add_rms.json"
      [ "${DIAG_SOFTMAX_STEP:-0}" = 1 ] && run diag_softmax_step bash -c "cd bench && timeout ${STEP_TIMEOUT:-200} python3 diag_softmax_step.py ${STEP_ARGS:-} --out $L/diag_softmax_step.json"
      [ "${DIAG_NORM_WW:-0}" = 1 ] && run diag_norm_ww bash -c "cd bench && python3 diag_norm_whole_warps.py --out $L/diag_norm_ww.json"
      [ "${DIAG_SMALL:-0}" = 1 ] && run diag_small python3 bench/diag_small_rows.py --json "$L/diag_small.json" ${SMALL_ARGS:-}
      [ "${DIAG_GATED_LARGE:-0}" = 1 ] && run diag_gated_large python3 bench/diag_gated_large.py --json "$L/diag_gated_large.json" ${GATED_ARGS:-}
      [ "${DIAG_SOFTMAX_STAGED:-0}" = 1 ] && run diag_softmax_staged python3 bench/diag_softmax_staged.py --json "$L/diag_softmax_staged.json"
      [ "${DIAG_GATED_STEP:-0}" = 1 ] && run diag_gated_step bash -c "cd bench && python3 diag_gated_step.py --json $L/diag_gated_step.json ${GATED_STEP_ARGS:-}"
      if [ "${NCU_ROTARY:-0}" = 1 ]; then  # Nsight Compute on our rotary kernel and compile's (NCU_ROTARY_ARGS)
        run ncu_rotary ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
          -k 'regex:rotary|triton' -c 40 python3 bench/diag_rotary.py --ncu ${NCU_ROTARY_ARGS:---dtype float32 --shapes 2048x2048}
      fi
      if [ "${DIAG_ROTARY:-0}" = 1 ]; then
        run diag_rotary python3 bench/diag_rotary.py --json "$L/diag_rotary.json" ${ROTARY_DIAG_ARGS:-}
        [ -n "${ROTARY_DIAG_ARGS2:-}" ] && run diag_rotary2 python3 bench/diag_rotary.py --json "$L/diag_rotary2.json" $ROTARY_DIAG_ARGS2
        [ -n "${ROTARY_DIAG_ARGS3:-}" ] && run diag_rotary3 python3 bench/diag_rotary.py --json "$L/diag_rotary3.json" $ROTARY_DIAG_ARGS3
      fi
      [ "${DIAG_NORM_REGS:-0}" = 1 ] && run diag_norm_regs bash -c "cd bench && python3 diag_norm_bwd_regs.py ${REGS_ARGS:-} --out $L/diag_norm_regs.json"
      [ -n "${AB_BEFORE:-}" ] && run diag_ab python3 bench/diag_kernels_ab.py --before "$AB_BEFORE" --out "$L/diag_ab.json" ${AB_ARGS:-}
      [ "${TESTS:-1}" = 1 ] && run ops_tests timeout "${TESTS_TIMEOUT:-600}" python3 -m pytest -q -p no:cacheprovider -rs ${TESTS_K:+-k "$TESTS_K"} ${TESTS_FILES:-$(ls tests/ops/test_ops_*_gpu.py | grep -v '^tests/ops/test_ops_gpu.py$') \
        tests/ops/test_ops_native.py tests/ops/test_ops_gpu.py}
      [ "${DIAG_EW:-0}" = 1 ] && run diag_ew python3 bench/diag_ew_map.py --json "$L/diag_ew.json"
      [ "${ROTARY_IP:-0}" = 1 ] && run bench_rotary_inplace python3 bench/bench_rotary_inplace.py --json "$L/rotary_inplace.json"
      [ "${EW_BENCH:-0}" = 1 ] && run bench_ops_quick python3 bench/bench_ops.py --out "$L/ew" --quick --budget-s 120
      [ "${PEERS:-1}" = 1 ] && run peers python3 bench/bench_ops_peers.py --out "$L/peers" ${PEERS_ARGS:-}
      [ -n "${PEERS_ARGS2:-}" ] && run peers2 python3 bench/bench_ops_peers.py --out "$L/peers2" $PEERS_ARGS2
      if [ "${LLAMA:-0}" = 1 ]; then  # LLAMA_MODELS: "hf" (default), "plain" or both
        for m in ${LLAMA_MODELS:-hf}; do
          run "llama_$m" timeout "${LLAMA_TIMEOUT:-600}" python3 bench/bench_llama_step.py --model "$m" --out "$L/llama_$m" ${LLAMA_ARGS:-}
        done
      fi
    else
      run new_ops python3 -m pytest -q -p no:cacheprovider -rs tests/ops/test_ops_gated_gpu.py \
        tests/ops/test_ops_fused_gpu.py tests/ops/test_ops_rotary_gpu.py tests/ops/test_ops_cross_entropy_gpu.py
      run peers python3 bench/bench_ops_peers.py --out "$L/peers" ${PEERS_ARGS:-}
      for m in ${LLAMA_MODELS:-hf}; do
        run "llama_$m" python3 bench/bench_llama_step.py --model "$m" --out "$L/llama_$m" ${LLAMA_ARGS:-}
      done
    fi
    ;;
  kernels|ext) exec bash "scripts/gpu_check_${PART/ext/cuda_ext}.sh" "$@" ;;
  package) exec bash scripts/gpu_check_package.sh "$@" ;;
  *) echo "usage: gpu_check.sh tests|bench|autograd|peers|ops|package|kernels|ext"; exit 2 ;;
esac
tar -czf "$OUT/$PART.tgz" -C "$W" "$PART"
for f in "$L"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/"; done 2>/dev/null
echo; echo "== $PART on $(head -1 "$L/versions.txt") =="
for name in "${!RC[@]}"; do
  printf '%-28s rc=%s  %s\n' "$name" "${RC[$name]}" "$(grep -E 'passed|failed|error' "$L/$name.log" | tail -1 | cut -c1-90)"
done | sort
rc=0; for v in "${RC[@]}"; do [ "$v" -ne 0 ] && rc=1; done; exit $rc
