#!/usr/bin/env bash
# device_python.sh (copied to .gpu_bundle/run_python.sh): the Python front
# end on the GPU machine, from the repository root: the package's checks
# (CUDA tensors, hooks on a second thread, CUDA-graph capture, the DeepEP
# Buffer in LL and normal mode and both through one Buffer, high-throughput
# groups), the adapters' decode loop and the per-call overhead bench.
B=.gpu_bundle
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MOE_EP_LIBRARY=$PWD/$B/libmoe_ep.so PYTHONPATH=$PWD/integration/python PYTHONUNBUFFERED=1
O=${OUT:-/tmp}
mkdir -p "$O"  # the logs go here; OUT may name a folder not made yet
# Ranks of the multi-GPU checks: MEP_RANKS, else every GPU nvidia-smi lists.
N=${MEP_RANKS:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")}
[ "$N" -ge 1 ] 2>/dev/null || N=1
# MEP_PY_PARTS picks gpu_check.py's parts (a short run: "group deep_ep").
for part in ${MEP_PY_PARTS:-group deep_ep deep_ep_fp8 deep_ep_graph deep_ep_graph_fp8 ht auto dropped}; do
  timeout 200 $B/moe_ep_run -n $N --timeout_s 190 -- python3 integration/python/gpu/gpu_check.py $part > $O/py_$part.log 2>&1
  # The per-check "ok" lines (ht prints one per check) stay in the log.
  echo "py_$part: exit $?"; grep -E "ok|FAIL|bit-exact|ulp|Error|skipped|failures" $O/py_$part.log \
    | grep -vE "^rank [0-9]+ .*: ok$" | head -12
done
# The package's fp8 quantiser (the vLLM adapter's, before an HT dispatch)
# against the library's kernel, bit for bit, one rank.
MOE_EP_RANK=0 MOE_EP_WORLD_SIZE=1 timeout 120 python3 integration/python/gpu/fp8_check.py > $O/py_fp8.log 2>&1
echo "py_fp8: exit $?"; grep -E "FAIL|ok$|Error" $O/py_fp8.log | tail -4
# The e4m3 encoders against the oracle with this torch, whose
# float8_e4m3fn the CPU tests' Debian torch lacks (there the native
# encoder's cases skip): here a skip is a failure.
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs integration/python/tests/test_fp8.py \
  -k native > $O/py_fp8_native.log 2>&1
rc=$?; grep -qi "skipped" $O/py_fp8_native.log && rc=1
echo "py_fp8_native: exit $rc"; tail -3 $O/py_fp8_native.log
timeout 200 $B/moe_ep_run -n $N --timeout_s 190 -- python3 integration/python/examples/decode_loop.py --steps 20 --hidden 2048 > $O/py_decode.log 2>&1
echo "py_decode_loop: exit $?"; tail -4 $O/py_decode.log
# The per-call cost at 128 tokens for bf16 and fp8 rows (fp8 allocates a
# third output, its scales), pinned to one core. With a base package in
# the bundle (device_suite.sh's MEP_PY_BASE) the two alternate, three
# rounds each, so both see the same machine state.
PKGS="integration/python"
[ -d $B/base_py/integration/python ] && PKGS="$B/base_py/integration/python integration/python"
ROUNDS=1; [ "$PKGS" != "integration/python" ] && ROUNDS=3
for fmt in bf16 fp8; do
  for round in $(seq $ROUNDS); do
    for pkg in $PKGS; do
      tag=$([ "$pkg" = integration/python ] && echo tree || echo base)
      PYTHONPATH=$PWD/$pkg MOE_EP_RANK=0 MOE_EP_WORLD_SIZE=1 timeout 120 taskset -c 3 \
        python3 $pkg/bench.py --hidden 7168 --experts 256 --tokens 128 --format $fmt \
        > $O/py_bench_${fmt}_${tag}_$round.log 2>&1
      echo "py_bench_$fmt ($tag, round $round): exit $?"; tail -11 $O/py_bench_${fmt}_${tag}_$round.log
    done
  done
done
