#!/usr/bin/env bash
# The GPU half of the kernel work, for a machine with one CUDA device (each phase fits a 10-minute call):
#   bash tests/gpu/run.sh tests   # the kernel tests here (kernels at larger shapes, engine parity with transformers,
#                                 # the pool from a memory fraction)
#   bash tests/gpu/run.sh bench   # python -m benchmarks.kernels --tune
#   bash tests/gpu/run.sh serving # engine tests (float32 parity with CUDA graphs, memory fraction), then
#                                 # benchmarks/gpu_serving.py on an 8B-shaped checkpoint made on the GPU
#   bash tests/gpu/run.sh disaggregated  # CUDA transfer tests, benchmarks/transfer_cuda.py (pool to pool, bare
#                                        # pools), then benchmarks/gpu_disaggregated.py (P and D processes on
#                                        # the one GPU); needs the ucxx wheels installed
#   bash tests/gpu/run.sh profile # benchmarks/gpu_decode_profile.py on the same checkpoint
#   bash tests/gpu/run.sh fp8     # the FP8 and decode-attention kernel tests, then benchmarks/gpu_fp8.py (the
#                                 # kernel table per shape, then the 8B shape served in bf16 and FP8)
#   bash tests/gpu/run.sh all     # every phase above in turn: every GPU result file regenerated from this checkout
#                                 # (about 45 minutes; each phase also fits one 10-minute device call)
# Logs and kernels.json go to $OUT when it is set (the device tool's folder that comes back), else to
# benchmarks/results/.
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # kvferry from this checkout, installed or not
python=${PYTHON:-python3}
# tests/conftest.py's plugins import the router (FastAPI, OpenTelemetry...), which the GPU image lacks; these tests
# need only the model fixtures (the CUDA transfer test of `disaggregated` too; it needs the ucxx wheels carried).
gpu_pytest=("$python" -m pytest --noconftest -p support.models -p support.real_model)

case "${1:-}" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    "$python" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
    timeout ${TESTS_TIMEOUT:-570} "${gpu_pytest[@]}" tests/gpu/test_cuda_kernels.py tests/gpu/test_cuda_engine_parity.py \
      tests/gpu/test_cuda_memory.py tests/unit/test_triton_dispatch.py -q -s -p no:cacheprovider \
      --durations=15 2>&1 | tee "$out/gpu_tests.log"
    ;;
  serving)
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
    timeout ${TESTS_TIMEOUT:-240} "${gpu_pytest[@]}" tests/gpu/test_cuda_memory.py tests/gpu/test_cuda_engine_parity.py -q -s \
      -p no:cacheprovider ${TESTS_FILTER:+-k "$TESTS_FILTER"} --durations=8 2>&1 | tee "$out/gpu_tests.log"
    timeout ${BENCH_TIMEOUT:-560} "$python" -m benchmarks.gpu_serving --out "$out" --budget-s ${BENCH_BUDGET:-420} \
      2>&1 | tee "$out/gpu_serving.log"
    ;;
  disaggregated)  # needs ucxx: carry .whl (see the device README) and install it before this phase
    model=/tmp/kvferry-llama-8b-shape
    # The test's peer process runs with PYTHONPATH=tests/ alone (support/peer_process.py): a .pth makes kvferry, and
    # nothing else of the checkout, importable for it (kvferry/__init__.py finds the component folders beside it).
    link_dir=$(mktemp -d) && ln -s "$PWD/kvferry" "$link_dir/kvferry"
    echo "$link_dir" > "$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kvferry-checkout.pth"
    timeout 120 "${gpu_pytest[@]}" tests/gpu/test_transfer_cuda.py -q -p no:cacheprovider 2>&1 | tee "$out/transfer_tests.log"
    timeout 120 "$python" -m benchmarks.transfer_cuda --out "$out" 2>&1 | grep -v "UCX  WARN" | tee "$out/transfer_cuda.log"
    [ -f $model/config.json ] || "$python" -c "from kvferry.engine.make_model import make_model; make_model('llama', '8b-shape', '$model', dtype='bfloat16', num_shards=4, device='cuda')"
    sync
    timeout ${BENCH_TIMEOUT:-420} "$python" -m benchmarks.gpu_disaggregated --model "$model" --out "$out" 2>&1 \
      | grep -v "UCX  WARN" | tee "$out/gpu_disaggregated.log"
    ;;
  profile)  # benchmarks/gpu_decode_profile.py: a decode step's kernel time by kind beside its graph replay
    model=/tmp/kvferry-llama-8b-shape
    [ -f $model/config.json ] || "$python" -c "from kvferry.engine.make_model import make_model; make_model('llama', '8b-shape', '$model', dtype='bfloat16', num_shards=4, device='cuda')"
    timeout ${BENCH_TIMEOUT:-300} "$python" -m benchmarks.gpu_decode_profile --model "$model" --out "$out" 2>&1 | tee "$out/gpu_decode_profile.log"
    ;;
  all)
    for phase in tests bench serving disaggregated profile fp8; do bash "$0" "$phase"; done
    ;;
  fp8)
    timeout ${TESTS_TIMEOUT:-240} "${gpu_pytest[@]}" tests/gpu/test_cuda_fp8.py tests/gpu/test_cuda_kernels.py -q \
      -p no:cacheprovider -k "${TESTS_FILTER:-fp8 or decode or linear}" --durations=8 2>&1 | tee "$out/gpu_fp8_tests.log"
    timeout ${BENCH_TIMEOUT:-400} "$python" -m benchmarks.gpu_fp8 --out "$out" ${FP8_ARGS:-} 2>&1 | tee "$out/gpu_fp8.log"
    ;;
  bench)
    timeout 570 "$python" -m benchmarks.kernels --tune --out "$out/kernels.json" 2>&1 | tee "$out/bench.log"
    ;;
  *)
    echo "usage: $0 tests|bench|serving|disaggregated|profile|fp8|all" >&2
    exit 2
    ;;
esac
