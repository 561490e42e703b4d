#!/usr/bin/env bash
# device_suite.sh: everything the GPU machine runs, built here and bundled:
# the kernel-level test (tests/gpu) and kernel bench, the public-API conformance workers on
# the nccl backend (LSA, GIN-emulated, EP1/EP2, absent-peer timeout), the
# demo and the benchmark. Usage:
#   tools/device_suite.sh            # build + bundle into .gpu_bundle/ and .gpu_bundle.txz
# then, on the GPU machine, from the checkout with .gpu_bundle.txz copied there:
#   tar xJf .gpu_bundle.txz && bash .gpu_bundle/run_device.sh [full|quick|one|...]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# The probes are plain nvcc builds (Bazel's cuda_library uses the same nvcc).
NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
T=(//plugin:libmoe_ep.so //tests/host:conformance_worker //tools/launcher:moe_ep_run
   //tests/gpu:ll_gpu_test //tests/gpu:prepare_layout_gpu_test //tests/gpu:set_reuse_gpu_test //tests/gpu:caller_context_gpu_test
   //tests/gpu:graph_destroy_gpu_test
   //tests/gpu:export_layout_gpu_test //tests/gpu:ht_world_test //tests/gpu:ht_world_shape_test
   //tests/gpu:ht_world_overlap_test //tests/gpu:ll_world_test //tests/gpu:ll_world_reuse_test
   //tests/gpu:ll_world_order_test //tests/gpu:ll_world_abort_test //tests/gpu:ll_world_shape_test
   //tests/gpu:libnccl_stall.so
   //integration:moe_ep_demo)
[ -f tools/bench/BUILD.bazel ] && T+=(//tools/bench:moe_ep_bench //tools/bench:ll_kernel_bench)
bazel build "${T[@]}"
rm -rf .gpu_bundle && mkdir -p .gpu_bundle
for f in plugin/libmoe_ep.so tests/host/conformance_worker tools/launcher/moe_ep_run \
         tests/gpu/ll_gpu_test tests/gpu/prepare_layout_gpu_test \
         tests/gpu/set_reuse_gpu_test tests/gpu/caller_context_gpu_test tests/gpu/export_layout_gpu_test \
         tests/gpu/graph_destroy_gpu_test \
         tests/gpu/ht_world_test tests/gpu/ht_world_shape_test tests/gpu/ht_world_overlap_test \
         tests/gpu/ll_world_test \
         tests/gpu/ll_world_reuse_test tests/gpu/ll_world_order_test tests/gpu/ll_world_abort_test \
         tests/gpu/ll_world_shape_test \
         tests/gpu/libnccl_stall.so integration/moe_ep_demo \
         tools/bench/moe_ep_bench tools/bench/ll_kernel_bench; do
  [ -f "bazel-bin/$f" ] && cp -L "bazel-bin/$f" .gpu_bundle/
done
cp integration/configs/*.yaml .gpu_bundle/
# The NVLink micro-probe (launch, fence, signal and copy costs; no NCCL).
"$NVCC" -O3 -arch=sm_90 -o .gpu_bundle/nvlink_probe tools/probe/nvlink_probe.cu
# The HT copy floors (peer stores by warps and by TMA, both ways; local copies).
"$NVCC" -O3 -arch=sm_90 -o .gpu_bundle/ht_probe tools/probe/ht_probe.cu
# The LL combine's pre-reduction shape alone (expert-row loads, the link;
# one GPU, and both GPUs at once).
"$NVCC" -O3 -arch=sm_90 -I. -o .gpu_bundle/reduce_probe tools/probe/reduce_probe.cu
# One warp's copy of a received dispatch row, plain against line rows
# (the line formats' copy and flag-check forms; one GPU).
"$NVCC" -O3 -arch=sm_90 -I. -o .gpu_bundle/line_copy_probe tools/probe/line_copy_probe.cu
# Which host calls wait for a held stream (run_device.sh hold).
"$NVCC" -O3 -arch=sm_90 -o .gpu_bundle/hold_probe tools/probe/hold_probe.cu -ldl
# MEP_PY_BASE=<revision>: that revision's Python package travels too, and
# run_python.sh benches it next to the working tree's (an A/B of the
# package's per-call cost in one run).
if [ -n "${MEP_PY_BASE:-}" ]; then
  mkdir -p .gpu_bundle/base_py
  git archive "$MEP_PY_BASE" integration/python | tar -x -C .gpu_bundle/base_py
fi
cp tools/device_run.sh .gpu_bundle/run_device.sh
cp tools/device_python.sh .gpu_bundle/run_python.sh
# The same bundle as one xz archive: the kernels' fat binaries compress
# about 5x (about 11 MB instead of 59 to copy). On the GPU machine: tar xJf .gpu_bundle.txz && bash .gpu_bundle/run_device.sh
tar cf - .gpu_bundle | xz -T0 -6 > .gpu_bundle.txz
echo "bundle: $(du -sh .gpu_bundle | cut -f1) in .gpu_bundle/, $(du -sh .gpu_bundle.txz | cut -f1) packed in .gpu_bundle.txz"
