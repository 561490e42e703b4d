#!/usr/bin/env bash
# device_run.sh (copied to .gpu_bundle/run_device.sh): runs on the GPU
# machine from the repository root; every log goes to $OUT.
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/mep_out}
B=.gpu_bundle
mkdir -p "$OUT"
MODE=${1:-full}
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
summary() { echo "$1: exit $2" | tee -a "$OUT/summary.txt"; }
api() {  # name ranks worker-args...
  local name=$1 n=$2; shift 2
  timeout 300 $B/moe_ep_run -n "$n" --timeout_s 280 -- $B/conformance_worker \
    --plugin=$B/libmoe_ep.so --backend=nccl "$@" > "$OUT/api_$name.log" 2>&1
  local rc=$?
  summary "api_$name" $rc
  grep -hE "^(PASSED|FAILED)|^FAIL" "$OUT/api_$name.log" | head -6
}
api ep2_lsa_fp8 2 --experts=256 --max_tokens=128 --dtype=fp8 --layers=7168:8,2048:1 --seeds=1
api ep2_ginemu_bf16 2 --transport=gin_emulated --experts=256 --max_tokens=128 --layers=7168:8,384:9 --seeds=1
api ep2_lsa_packed 2 --experts=64 --max_tokens=128 --dtype=fp8 --scale=ue8m0_packed --layers=2048:32,128:8 --seeds=1
api ep2_skip_timeout 2 --scenario=skip --experts=8 --max_tokens=8 --layers=128:2 --kernel_ms=2000
api ep1_bf16 1 --experts=8 --max_tokens=64 --layers=2048:2 --seeds=1
if [ "$MODE" = full ]; then
  api ep2_ginemu_ue8m0 2 --transport=gin_emulated --experts=64 --max_tokens=1 --dtype=fp8 --scale=ue8m0 --layers=7168:9,2048:32
  sed 's/backend: host/backend: nccl/' $B/demo.yaml > "$OUT/demo_nccl.yaml"
  timeout 120 $B/moe_ep_run -n 2 -- $B/moe_ep_demo --config "$OUT/demo_nccl.yaml" \
    --plugin $B/libmoe_ep.so --steps 50 --verify > "$OUT/demo.log" 2>&1
  summary demo $?; tail -4 "$OUT/demo.log"
  timeout 240 $B/ll_gpu_test > "$OUT/ll_gpu_test.log" 2>&1
  summary ll_gpu_test $?
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/ll_gpu_test.log" | head -20
  if [ -x $B/moe_ep_bench ]; then
    timeout 280 $B/moe_ep_run -n 2 -- $B/moe_ep_bench --plugin=$B/libmoe_ep.so \
      --json="$OUT/bench.json" > "$OUT/bench.log" 2>&1
    summary bench $?; tail -40 "$OUT/bench.log"
  fi
fi
cat "$OUT/summary.txt"
