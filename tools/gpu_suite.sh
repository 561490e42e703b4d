#!/usr/bin/env bash
# gpu_suite.sh: builds the GPU test binaries here (no GPU needed), copies them
# into .gpu_bundle/ (bazel-bin is a symlink and does not travel), and prints
# the one device `run` command that executes the suite on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTPUT_BASE="${MEP_BAZEL_OUTPUT_BASE:-/root/.cache/bazel_gpu}"
# GPU tests are tagged manual, which wildcards skip: name them.
bazel --output_base="$OUTPUT_BASE" build //kernels/... //tests/gpu:ll_gpu_test
rm -rf .gpu_bundle
mkdir -p .gpu_bundle
BIN="$(bazel --output_base="$OUTPUT_BASE" info bazel-bin 2>/dev/null)"
cp -L "$BIN/tests/gpu/ll_gpu_test" .gpu_bundle/
cat > .gpu_bundle/run_suite.sh <<'INNER'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root; logs go to $OUT.
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
OUT=${OUT:-/tmp/mep_out}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || true
rc=0
# Every test runs (the H2056 hang is fixed: a warp shuffle inside a loop
# whose lanes left it at different trips, in combine_recv). MEP_GPU_FILTER
# narrows it.
FILTER=${MEP_GPU_FILTER:-*}
timeout 300 .gpu_bundle/ll_gpu_test --gtest_filter="$FILTER" "$@" > "$OUT/ll_gpu_test.log" 2>&1 || rc=$?
# World 1 (one rank, GPU 0, every expert local): the path a 1-GPU machine
# runs. Skip with MEP_GPU_WORLD1=0.
if [ "${MEP_GPU_WORLD1:-1}" != 0 ]; then
  MOE_EP_TEST_WORLD=1 timeout 200 .gpu_bundle/ll_gpu_test --gtest_filter="${MEP_GPU_FILTER1:--*Bench*}" \
    > "$OUT/ll_gpu_test_world1.log" 2>&1 || { echo "world-1 run exit $?"; rc=1; }
  grep -E "^\[  (PASSED|FAILED) |FAILED  |Failure|ll_gpu_test:" "$OUT/ll_gpu_test_world1.log" | sed 's/^/world1: /' | head -40
fi
MOE_EP_TEST_GIN=1 timeout 90 .gpu_bundle/ll_gpu_test --gtest_filter="*GinRequest*" > "$OUT/gin_request.log" 2>&1 || echo "gin request run exit $?"
grep -h "GIN request" "$OUT/gin_request.log"
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |FAILED  |BENCH|TIMEOUT record|GIN request|NCCL up|ll_gpu_test:|Failure|error|timeout record|rank [0-9]: (exit|killed)" "$OUT/ll_gpu_test.log" | head -150
echo "ll_gpu_test exit code $rc"
exit $rc
INNER
chmod +x .gpu_bundle/run_suite.sh
echo "bundle ready in .gpu_bundle/ ($(du -sh .gpu_bundle | cut -f1))"
echo 'device run: kind=nvidia-h200-x2 carry=[".gpu_bundle"] command="bash .gpu_bundle/run_suite.sh"'
