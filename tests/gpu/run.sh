#!/usr/bin/env bash
# The GPU half of the kernel work, for a machine with one CUDA device (each phase fits a 10-minute call):
#   bash tests/gpu/run.sh tests   # the kernel tests here (kernels at larger shapes, engine parity with transformers)
#   bash tests/gpu/run.sh bench   # benchmarks/kernels.py --tune
# Logs and kernels.json go to $OUT when it is set (the device tool's folder that comes back), else to
# benchmarks/results/.
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # kvferry from this checkout, installed or not
python=${PYTHON:-python3}

case "${1:-}" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    "$python" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
    timeout 570 "$python" -m pytest tests/gpu/test_cuda_kernels.py tests/gpu/test_cuda_engine_parity.py tests/unit/test_triton_dispatch.py -q -s -p no:cacheprovider \
      --durations=15 2>&1 | tee "$out/gpu_tests.log"
    ;;
  bench)
    timeout 570 "$python" benchmarks/kernels.py --tune --out "$out/kernels.json" 2>&1 | tee "$out/bench.log"
    ;;
  *)
    echo "usage: $0 tests|bench" >&2
    exit 2
    ;;
esac
