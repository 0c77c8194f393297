#!/usr/bin/env bash
# On the GPU machine: install opsmith (and onnxruntime-gpu, onnx, onnxscript when missing), run the
# ONNX Runtime tests (CI's CPU ones and the CUDA-provider ones), then the ORT benchmark on the GPU
# (opsmith ReLU node vs ORT's Relu, 4 KiB and 1 GiB) and on the CPU. Results under $OUT/ort/;
# the benchmark tables print last.
#   bash scripts/gpu_check_ort.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/opsmith-gpu-out}"; D="$OUT/ort"; mkdir -p "$D"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$D/pip.log" 2>&1 || { tail -20 "$D/pip.log"; exit 1; }
if ! python3 -c 'import onnxruntime, sys; sys.exit("CUDAExecutionProvider" not in onnxruntime.get_available_providers())' 2>/dev/null; then
  # the CUDA 13 build of onnxruntime-gpu; wheels placed in shared/wheels are preferred (no network there)
  python3 -m pip install -q ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} $( [ -d shared/wheels ] && echo --find-links shared/wheels ) \
    onnxruntime-gpu onnx onnxscript >>"$D/pip.log" 2>&1 || echo "could not install onnxruntime-gpu (see $D/pip.log): CUDA tests will skip"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())'
  python3 -m opsmith doctor 2>&1 | grep -E "ONNX|ORT"
} 2>&1 | tee "$D/versions.txt"
python3 -m pytest -q -p no:cacheprovider -rs tests/onnx/test_onnx_ort.py tests/onnx/test_onnx_ort_gpu.py tests/onnx/test_onnx_templates.py tests/test_opdesc.py \
  --junitxml="$D/pytest.xml" 2>&1 | tee "$D/pytest.log" | tail -30
python3 bench/bench_ort.py --device cpu --sizes 4096,67108864 --json "$D/bench_ort_cpu.json" 2>&1 \
  | grep -v -i "warn\|torch.onnx\|__new__" | tee "$D/bench_cpu.log" | tail -5
python3 bench/bench_ort.py --device cuda --json "$D/bench_ort_cuda.json" 2>&1 \
  | grep -v -i "warn\|torch.onnx\|__new__" | tee "$D/bench_cuda.log" | tail -5
