#!/usr/bin/env bash
# device_run.sh (copied to .gpu_bundle/run_device.sh): the GPU suite, run on
# the GPU machine from the repository root, most important first; every log
# goes to $OUT and a one-line verdict per step to $OUT/summary.txt.
# Usage: bash .gpu_bundle/run_device.sh [full|quick|one|ab|extra]; quick stops after
# the kernel test, the weighted-dispatch and hidden-2880 API runs and the
# eager benchmarks;
# one is for a 1-GPU machine (EP1 suites, sanitizers, an EP1 benchmark, and
# an A/B against .gpu_bundle/prev/libmoe_ep.so when that exists); ab
# compares 2-GPU phase stamps and bench with variants in .gpu_bundle/ab/.
MODE=${1:-full}
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Logs are written under a scratch folder and handed back as one archive
# ($OUT/logs.tgz): the device tool returns only a few files per call.
FINAL_OUT=${OUT:-/tmp/mep_out}
OUT=/tmp/mep_logs
B=.gpu_bundle
rm -rf "$OUT" && mkdir -p "$OUT" "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . 2>/dev/null' EXIT
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
summary() { echo "$1: exit $2" | tee -a "$OUT/summary.txt"; }
api() {  # name ranks seconds worker-args...
  local name=$1 n=$2 secs=$3; shift 3
  timeout $((secs + 5)) $B/moe_ep_run -n "$n" --timeout_s "$secs" -- $B/conformance_worker \
    --plugin=$B/libmoe_ep.so --backend=nccl "$@" > "$OUT/api_$name.log" 2>&1
  summary "api_$name" $?
  grep -hE "^(PASSED|FAILED)|^FAIL|GIN|nccl group" "$OUT/api_$name.log" | head -6
}
# prepare's layout outputs on the GPU against the oracle (one process, no
# NCCL), plain and under memcheck.
prepare_layout() {
  timeout 120 $B/prepare_layout_gpu_test > "$OUT/prepare_layout.log" 2>&1
  summary prepare_layout_gpu_test $?
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|FAIL " "$OUT/prepare_layout.log" | head -6
  timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 $B/prepare_layout_gpu_test \
    > "$OUT/prepare_layout_memcheck.log" 2>&1
  summary prepare_layout_memcheck $?
  grep -hE "ERROR SUMMARY" "$OUT/prepare_layout_memcheck.log" | head -1
}
# ab: this bundle against each variant under .gpu_bundle/ab/<name>/ (a
# libmoe_ep.so and ll_kernel_bench built from another tree) on 2 GPUs, taking
# turns so drift hits all: the fused dispatch's phase stamps, then the
# eager bench.
if [ "$MODE" = ab ]; then
  for round in 1 2; do
    for D in $B $B/ab/*; do
      [ -f "$D/libmoe_ep.so" ] || continue
      name=$(basename "$D"); [ "$D" = $B ] && name=cur
      timeout 60 $D/ll_kernel_bench phases > "$OUT/stamps_${name}_$round.log" 2>&1
      summary "stamps_${name}_$round" $?
      grep -E "^PHASES rank 0" "$OUT/stamps_${name}_$round.log" | sed "s/^/$name $round: /"
      timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- $B/moe_ep_bench --plugin=$D/libmoe_ep.so \
        --dtype=fp8 --tokens=1,8,128,256 --warmup=50 > "$OUT/bench_${name}_$round.log" 2>&1
      summary "bench_${name}_$round" $?
      grep -E "^fp8 .*\| .*\| " "$OUT/bench_${name}_$round.log" | head -8 | cut -c1-98 | sed "s/^/$name $round: /"
      # several local experts per receive block: a 24-SM grid, and 1024 experts
      for extra in --num_sms=24 --experts=1024; do
        timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- $B/moe_ep_bench --plugin=$D/libmoe_ep.so \
          --dtype=fp8 --tokens=1,128 --warmup=50 $extra > "$OUT/bench_${name}_${extra#--}_$round.log" 2>&1
        summary "bench_${name}_${extra#--}_$round" $?
        grep -E "^fp8 .*\| .*\| " "$OUT/bench_${name}_${extra#--}_$round.log" | head -4 | cut -c1-98 | sed "s/^/$name $round $extra: /"
      done
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# extra: the NVLink probe (launch floors, eager and in a graph; the
# two-GPU row-and-flag exchange under a 1-token dispatch) and the dispatch's
# cost against the expert count (the send lists every expert: 256, 1024 and
# 2048 experts, i.e. up to the 1024 local experts of the limit at EP2).
if [ "$MODE" = extra ]; then
  timeout 120 $B/nvlink_probe 1000 > "$OUT/probe.log" 2>&1
  summary nvlink_probe $?
  cat "$OUT/probe.log"
  for e in 256 1024 2048; do
    timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- $B/moe_ep_bench --plugin=$B/libmoe_ep.so \
      --dtype=fp8 --tokens=1,128,256 --experts=$e --warmup=50 > "$OUT/bench_e$e.log" 2>&1
    summary "bench_experts_$e" $?
    grep -A8 "^latency" "$OUT/bench_e$e.log" | grep -E "^fp8" | cut -c1-110 | sed "s/^/E=$e: /"
  done
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = one ]; then
  prepare_layout
  MOE_EP_TEST_WORLD=1 timeout 90 $B/ll_gpu_test > "$OUT/ll_gpu_test_world1.log" 2>&1
  summary ll_gpu_test_world1 $?
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/ll_gpu_test_world1.log" | head -12
  MOE_EP_TEST_WORLD=1 timeout 60 $B/ll_kernel_bench latency > "$OUT/ll_kernel_bench_world1.log" 2>&1
  summary ll_kernel_bench_world1 $?
  grep -E "^BENCH" "$OUT/ll_kernel_bench_world1.log" | head -4
  api ep1_bf16 1 20 --experts=8 --max_tokens=64 --layers=2048:2 --seeds=1
  api ep1_fp8_dispatch_weights 1 40 --experts=256 --max_tokens=128 --dtype=fp8 \
    --layers=7168:8,2048:1 --seeds=2 --dispatch_weights=1
  api ep1_graph_dispatch_weights 1 40 --scenario=graph --experts=64 --max_tokens=32 \
    --layers=2048:8 --seeds=100 --dispatch_weights=1
  api ep1_bf16_h2880_dispatch_weights 1 40 --dtype=bf16 --experts=64 --max_tokens=64 \
    --layers=2880:9,1032:4 --seeds=2 --dispatch_weights=1
  for tool in memcheck racecheck; do
    for w in 0 1; do
      timeout 90 $B/moe_ep_run -n 1 --timeout_s 85 -- compute-sanitizer --tool $tool \
        --error-exitcode 9 $B/conformance_worker --plugin=$B/libmoe_ep.so --backend=nccl \
        --experts=8 --max_tokens=4 --layers=256:2 --seeds=1 --hooks=0 --dispatch_weights=$w \
        > "$OUT/${tool}_w$w.log" 2>&1
      summary "${tool}_dispatch_weights_$w" $?
      grep -hE "(ERROR|RACECHECK) SUMMARY" "$OUT/${tool}_w$w.log" | head -2
    done
  done
  # A/B, same machine, alternating so drift hits both: this bundle's
  # library and the previous one's, EP1, fp8, 1 and 128 tokens.
  for round in 1 2; do
    for lib in cur prev; do
      L=$B/libmoe_ep.so; [ $lib = prev ] && L=$B/prev/libmoe_ep.so
      [ -f "$L" ] || continue
      timeout 90 $B/moe_ep_run -n 1 --timeout_s 85 -- $B/moe_ep_bench --plugin=$L \
        --dtype=fp8 --tokens=1,128 --warmup=50 > "$OUT/bench1_${lib}_$round.log" 2>&1
      summary "bench1_${lib}_$round" $?
      grep -A4 "^latency" "$OUT/bench1_${lib}_$round.log" | grep -E "^fp8" | sed "s/^/$lib $round: /"
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
timeout 120 $B/ll_gpu_test > "$OUT/ll_gpu_test.log" 2>&1
summary ll_gpu_test $?
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/ll_gpu_test.log" | head -20
timeout 90 $B/ll_kernel_bench > "$OUT/ll_kernel_bench.log" 2>&1
summary ll_kernel_bench $?
grep -E "^BENCH|^PHASES rank 0 tokens (1|128) fused" "$OUT/ll_kernel_bench.log" | head -12
# A small grid: every block takes many local experts (and its share of the
# slot lists in several rounds), every send warp many units.
MOE_EP_TEST_SMS=6 timeout 120 $B/ll_gpu_test > "$OUT/ll_gpu_test_sms6.log" 2>&1
summary ll_gpu_test_sms6 $?
# One SM: every local expert in one receive block, one after another; the
# hot-expert cases put 2048 slots into that block.
MOE_EP_TEST_SMS=1 timeout 120 $B/ll_gpu_test \
  --gtest_filter='*Hot*:*LsaFp8H7168*:*GinEmuFp8H7168*:*Repeated*:*LsaExpertLists*:*DoubleBuffered*' \
  > "$OUT/ll_gpu_test_sms1.log" 2>&1
summary ll_gpu_test_sms1 $?
prepare_layout   # one GPU is enough; the API runs below check prepare too
MOE_EP_TEST_WORLD=1 timeout 60 $B/ll_gpu_test > "$OUT/ll_gpu_test_world1.log" 2>&1
summary ll_gpu_test_world1 $?
api ep2_lsa_fp8 2 50 --experts=256 --max_tokens=128 --dtype=fp8 --layers=7168:8,2048:1 --seeds=1
# Weights given to dispatch: expert-side partials (all ranks; even ranks
# only over GIN-emulated; CUDA-graph replays).
api ep2_lsa_fp8_dispatch_weights 2 50 --experts=256 --max_tokens=128 --dtype=fp8 \
  --layers=7168:8,2048:1 --seeds=2 --dispatch_weights=1
api ep2_ginemu_dispatch_weights_mixed 2 50 --transport=gin_emulated --experts=64 \
  --max_tokens=64 --layers=4096:8,2048:2 --seeds=2 --dispatch_weights=mixed
api ep2_graph_dispatch_weights 2 40 --scenario=graph --experts=64 --max_tokens=32 \
  --layers=2048:8 --seeds=100 --dispatch_weights=1
# bf16 hidden a multiple of 8 but not of 128 (2880: gpt-oss; 1032, 2056)
# in both combine modes, bit-exact against the oracle: LSA with weights at
# combine and at dispatch, GIN-emulated with weights at combine and on even
# ranks only (one rank of each mode in the same run).
api ep2_lsa_bf16_h2880 2 50 --dtype=bf16 --experts=64 --max_tokens=128 \
  --layers=2880:9,1032:4 --seeds=2
api ep2_lsa_bf16_h2880_dispatch_weights 2 50 --dtype=bf16 --experts=64 --max_tokens=128 \
  --layers=2880:9,1032:4 --seeds=2 --dispatch_weights=1
api ep2_ginemu_bf16_h2880 2 50 --transport=gin_emulated --dtype=bf16 --experts=64 \
  --max_tokens=64 --layers=2880:4,2056:8 --seeds=2
api ep2_ginemu_bf16_h2880_dispatch_weights_mixed 2 50 --transport=gin_emulated --dtype=bf16 \
  --experts=64 --max_tokens=64 --layers=2880:4,2056:8 --seeds=2 --dispatch_weights=mixed
timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- $B/moe_ep_bench --plugin=$B/libmoe_ep.so \
  --warmup=50 --json="$OUT/bench.json" > "$OUT/bench.log" 2>&1
summary bench $?
grep -A22 "^latency" "$OUT/bench.log"
# The same with the weights at combine only (one row back per (token, expert)).
timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- $B/moe_ep_bench --plugin=$B/libmoe_ep.so \
  --warmup=50 --dispatch_weights=false --json="$OUT/bench_slots.json" > "$OUT/bench_slots.log" 2>&1
summary bench_slots $?
grep -A22 "^latency" "$OUT/bench_slots.log" | grep -E "^(fp8|bf16) .* (1|128|256) "
if [ "$MODE" = quick ]; then cat "$OUT/summary.txt"; exit 0; fi
timeout 150 $B/moe_ep_run -n 2 --timeout_s 140 -- $B/moe_ep_bench --plugin=$B/libmoe_ep.so \
  --warmup=50 --graph --json="$OUT/bench_graph.json" > "$OUT/bench_graph.log" 2>&1
summary bench_graph $?
grep -A24 "^latency" "$OUT/bench_graph.log"
# The engine-provided communicator path: the groups adopt the bench's own
# ncclComm (recv_count checked against the routing after every warm-up),
# and the bench keeps using that communicator after each group is gone.
timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- $B/moe_ep_bench --plugin=$B/libmoe_ep.so \
  --adopt_comm --tokens=8,128 --iters=50 --warmup=5 > "$OUT/bench_adopt.log" 2>&1
summary bench_adopt $?
grep -E "adopt|^fp8 .* 128 |^bf16 .* 128 " "$OUT/bench_adopt.log" | head -5
api ep2_graph 2 40 --scenario=graph --experts=64 --max_tokens=32 --layers=2048:8 --seeds=100
api ep2_routing 2 30 --scenario=routing --experts=64 --max_tokens=16 --layers=1024:4
MOE_EP_DOUBLE_BUFFER=false api ep2_single_set 2 30 --experts=64 --max_tokens=32 \
  --layers=2048:8 --seeds=1 --hooks=0
api ep2_skip_timeout 2 20 --scenario=skip --experts=8 --max_tokens=8 --layers=128:2 --kernel_ms=2000
sed 's/backend: host/backend: nccl/' $B/demo.yaml > "$OUT/demo_nccl.yaml"
timeout 30 $B/moe_ep_run -n 2 -- $B/moe_ep_demo --config "$OUT/demo_nccl.yaml" \
  --plugin $B/libmoe_ep.so --steps 50 --verify > "$OUT/demo.log" 2>&1
summary demo $?; tail -3 "$OUT/demo.log"
MOE_EP_TEST_TRACE=1 api ep2_ginemu_trace 2 25 --transport=gin_emulated --experts=256 \
  --max_tokens=128 --layers=7168:8 --seeds=1 --hooks=0 --kernel_ms=3000
api gin_request 2 15 --transport=gin --experts=8 --max_tokens=8 --layers=128:2
# A runtime NCCL other than the headers' (the system's copy): group_create
# must refuse, naming both versions (the step "fails" by design).
MOE_EP_NCCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libnccl.so.2 api nccl_version_refused 2 15 \
  --experts=8 --max_tokens=8 --layers=128:2
grep -h "version" "$OUT/api_nccl_version_refused.log" | head -2
api ep1_bf16 1 20 --experts=8 --max_tokens=64 --layers=2048:2 --seeds=1
timeout 60 $B/moe_ep_run -n 2 --timeout_s 55 -- compute-sanitizer --tool memcheck \
  --error-exitcode 9 $B/conformance_worker --plugin=$B/libmoe_ep.so --backend=nccl \
  --experts=8 --max_tokens=4 --layers=256:2 --seeds=1 --hooks=0 > "$OUT/memcheck.log" 2>&1
summary memcheck $?; grep -E "ERROR SUMMARY|PASSED|FAIL" "$OUT/memcheck.log" | head -4
# Kernel durations without the host in the picture (one metric: one pass,
# no replay, so the cross-rank signals still line up).
timeout 150 $B/moe_ep_run -n 2 --timeout_s 140 -- bash -c 'ncu --clock-control none \
  --metrics gpu__time_duration.sum -k regex:ll_ --csv --log-file "$0/ncu_rank$MOE_EP_RANK.csv" \
  '"$B"'/moe_ep_bench --plugin='"$B"'/libmoe_ep.so --tokens=1,128 --dtype=fp8 --iters=20 \
  --warmup=5' "$OUT" > "$OUT/ncu.log" 2>&1
summary ncu_durations $?
timeout 90 $B/moe_ep_run -n 2 --timeout_s 85 -- compute-sanitizer --tool racecheck \
  --error-exitcode 9 $B/conformance_worker --plugin=$B/libmoe_ep.so --backend=nccl \
  --experts=8 --max_tokens=4 --layers=256:2 --seeds=1 --hooks=0 > "$OUT/racecheck.log" 2>&1
summary racecheck $?; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAIL" "$OUT/racecheck.log" | head -4
cat "$OUT/summary.txt"
