#!/usr/bin/env bash
# device_run.sh (copied to .gpu_bundle/run_device.sh): the GPU suite, run on
# the GPU machine from the repository root, most important first; every log
# goes to $OUT and a one-line verdict per step to $OUT/summary.txt.
# Usage: [MEP_RANKS=N] bash .gpu_bundle/run_device.sh [full|quick|rest|one|world|api|check|llcheck|llscen|misc|ab|htab|htprof|llprof|llpc|sass|lltable|skew|extra|ht|htnet|scale|hold]; quick stops after
# the kernel test, the weighted-dispatch and hidden-2880 API runs and the
# eager benchmarks, and rest runs the rest of full (full = quick + rest);
# api runs quick's public-API half alone (world 1 and the oracle-checked
# API runs); one is for a 1-GPU machine (EP1 suites, LL and HT, sanitizers, an EP1 benchmark, and
# an A/B against .gpu_bundle/prev/libmoe_ep.so when that exists); world
# runs only one's world tests (3 to 16 ranks on one GPU); ab
# compares 2-GPU phase stamps and bench with variants in .gpu_bundle/ab/.
# MEP_RANKS sets the group size of the multi-GPU steps (default: every GPU
# nvidia-smi lists; 2 on the 2-GPU machine, 4 and 8 on the larger ones);
# their names carry it (ep2_*, ep4_*, ep8_*) and their time limits grow
# with it (more processes start NCCL and the sanitizers at once).
MODE=${1:-full}
N=${MEP_RANKS:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")}
[ "$N" -ge 1 ] 2>/dev/null || N=1
E=ep$N
S=$(( N <= 2 ? 1 : (N <= 4 ? 2 : 3) ))
export MOE_EP_TEST_WORLD=${MOE_EP_TEST_WORLD:-$N}  # ll_gpu_test, ll_kernel_bench
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Logs are written under a scratch folder and handed back as one archive
# ($OUT/logs.tgz): one file is easier to carry back than many.
FINAL_OUT=${OUT:-/tmp/mep_out}
OUT=/tmp/mep_logs
B=.gpu_bundle
rm -rf "$OUT" && mkdir -p "$OUT" "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . 2>/dev/null' EXIT
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
# One line per step in summary.txt: "<step>: PASS|FAIL (<key number>)".
# summary NAME EXIT [KEY]: PASS exactly when EXIT is 0; a non-zero EXIT
# (124/137: the step ran out of time) is named before KEY.
# Each line ends with the seconds since the previous one (the step's
# wall time, NCCL's start-up included), so a short GPU run can be planned.
STEP_T0=$SECONDS
summary() {
  local verdict=PASS key=${3:-}
  [ "$2" = 0 ] || verdict=FAIL
  case $2 in
    0) ;;
    124|137) key="timed out${key:+, $key}" ;;
    *) key="exit $2${key:+, $key}" ;;
  esac
  key="${key:+$key; }$((SECONDS - STEP_T0)) s"
  STEP_T0=$SECONDS
  echo "$1: $verdict ($key)" | tee -a "$OUT/summary.txt"
}
# Key numbers, read from a step's log.
gtest_key() {  # "N tests passed[, M failed]"
  local ok bad
  ok=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" | awk '{s += $1} END {print s + 0}')
  bad=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" | awk '{s += $1} END {print s + 0}')
  echo "$ok tests passed$([ "$bad" = 0 ] || echo ", $bad failed")"
}
worker_key() {  # the conformance workers' checks and failures, all ranks
  awk '/^(PASSED|FAILED) rank=/ { for (i = 1; i <= NF; i++) { split($i, kv, "=");
       if (kv[1] == "checks") c += kv[2]; if (kv[1] == "failures") f += kv[2] } ; n++ }
       END { printf "%d ranks reported, %d checks, %d failures", n, c, f }' "$1"
}
bench_key() { echo "$(grep -cE "^(fp8|bf16) .*\| .*\| " "$1") latency rows"; }
# bench NAME SECONDS BENCH-ARGS...: moe_ep_bench on the group's N ranks
# (BENCH_RANKS=n for another count), within SECONDS scaled by S (the
# launcher's own limit 5 s under it); log $OUT/NAME.log, summary line NAME
# with its latency-row count. The caller shows what it wants of the log.
bench() {
  local name=$1 secs=$2; shift 2
  timeout $((secs * S)) $B/moe_ep_run -n "${BENCH_RANKS:-$N}" --timeout_s $(((secs - 5) * S)) -- \
    $B/moe_ep_bench "$@" > "$OUT/$name.log" 2>&1
  summary "$name" $? "$(bench_key "$OUT/$name.log")"
}
api() {  # name ranks seconds worker-args...
  local name=$1 n=$2 secs=$3; shift 3
  timeout $((secs + 5)) $B/moe_ep_run -n "$n" --timeout_s "$secs" -- $B/conformance_worker \
    --plugin=${PLUGIN:-$B/libmoe_ep.so} --backend=nccl --barrier_dir="$(mktemp -d)" "$@" \
    > "$OUT/api_$name.log" 2>&1
  summary "api_$name" $? "$(worker_key "$OUT/api_$name.log")"
  grep -hE "^(PASSED|FAILED)|^FAIL|GIN|nccl group" "$OUT/api_$name.log" | head -6
}
# A run that must be refused: PASS when it exits non-zero and its log has
# the expected sentence (name ranks seconds pattern worker-args...).
api_refused() {
  local name=$1 n=$2 secs=$3 pattern=$4; shift 4
  timeout $((secs + 5)) $B/moe_ep_run -n "$n" --timeout_s "$secs" -- $B/conformance_worker \
    --plugin=$B/libmoe_ep.so --backend=nccl "$@" > "$OUT/api_$name.log" 2>&1
  local rc=$? hits
  hits=$(grep -c -- "$pattern" "$OUT/api_$name.log")
  if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ] && [ "$hits" -gt 0 ]; then
    summary "api_$name" 0 "refused as expected, exit $rc, $hits lines name '$pattern'"
  else
    summary "api_$name" 1 "run exit $rc, $hits lines name '$pattern'"
  fi
  grep -h -- "$pattern" "$OUT/api_$name.log" | head -2
}
# compute-sanitizer on every rank of a command (name tool ranks seconds
# command...). PASS needs the command's success, one sanitizer summary per
# rank and 0 errors in all of them. CUDA API errors are not counted
# (--report-api-errors no): NCCL probes its kernel images at start-up and
# gets cudaErrorNoKernelImageForDevice for the architectures it lacks
# (ncclInitKernelsForDevice) on every run; moe-ep checks the status of every
# CUDA call it makes itself, and its tests fail on a bad one.
sanitize() {
  local name=$1 tool=$2 n=$3 secs=$4; shift 4
  local log="$OUT/$name.log" rc reports errors line="ERROR SUMMARY"
  [ "$tool" = racecheck ] && line="RACECHECK SUMMARY"  # "N hazards (E errors, W warnings)"
  timeout $((secs + 5)) $B/moe_ep_run -n "$n" --timeout_s "$secs" -- compute-sanitizer \
    --tool "$tool" --report-api-errors no --error-exitcode 9 "$@" > "$log" 2>&1
  rc=$?
  reports=$(grep -c "$line" "$log")
  errors=$(grep "$line" "$log" | grep -oE "[0-9]+ errors?" | awk '{s += $1} END {print s + 0}')
  local key="$errors errors in $reports of $n ranks' $tool summaries"
  if [ "$rc" = 0 ] && [ "$reports" -lt "$n" ]; then rc=1; fi
  if [ "$rc" = 0 ] && [ "$errors" != 0 ]; then rc=9; fi
  summary "$name" "$rc" "$key"
  grep -hE "(ERROR|RACECHECK) SUMMARY|^(PASSED|FAILED)|^FAIL|\[  (PASSED|FAILED) " "$log" | head -6
}
# prepare's layout outputs on the GPU against the oracle, then the LL
# handle's layout export (one process each, no NCCL), plain and under
# memcheck.
prepare_layout() {
  timeout 120 $B/prepare_layout_gpu_test > "$OUT/prepare_layout.log" 2>&1
  summary prepare_layout_gpu_test $? "$(gtest_key "$OUT/prepare_layout.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|FAIL " "$OUT/prepare_layout.log" | head -6
  sanitize prepare_layout_memcheck memcheck 1 175 $B/prepare_layout_gpu_test
  # The LL handle's layout in DeepEP's form, the same way.
  timeout 60 $B/export_layout_gpu_test > "$OUT/export_layout.log" 2>&1
  summary export_layout_gpu_test $? "$(gtest_key "$OUT/export_layout.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|FAIL " "$OUT/export_layout.log" | head -6
  sanitize export_layout_memcheck memcheck 1 115 $B/export_layout_gpu_test
}
# A zero-token layer with NULL data dispatches and combines, and replaces
# its set's layout (public API, one rank, one GPU); every entry leaves the
# calling thread's CUDA context as it was; group_destroy while a CUDA graph
# holds the group's calls says BUSY and keeps the memory the graph uses.
set_reuse() {
  timeout 65 $B/moe_ep_run -n 1 --timeout_s 60 -- $B/set_reuse_gpu_test \
    > "$OUT/set_reuse.log" 2>&1
  summary set_reuse_gpu_test $? "$(gtest_key "$OUT/set_reuse.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/set_reuse.log" | head -4
  timeout 65 $B/moe_ep_run -n 1 --timeout_s 60 -- $B/caller_context_gpu_test \
    > "$OUT/caller_context.log" 2>&1
  summary caller_context_gpu_test $? "$(gtest_key "$OUT/caller_context.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|context" "$OUT/caller_context.log" | head -8
  timeout 65 $B/moe_ep_run -n 1 --timeout_s 60 -- $B/graph_destroy_gpu_test \
    > "$OUT/graph_destroy.log" 2>&1
  summary graph_destroy_gpu_test $? "$(gtest_key "$OUT/graph_destroy.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|rank 0" "$OUT/graph_destroy.log" | head -8
  # Alone, so that its load is the library's only one (the unload unmaps
  # it unless the library pinned itself).
  timeout 65 $B/moe_ep_run -n 1 --timeout_s 60 -- $B/graph_destroy_gpu_test \
    --gtest_filter='*Unload*' > "$OUT/graph_unload.log" 2>&1
  summary graph_unload_gpu_test $? "$(gtest_key "$OUT/graph_unload.log")"
}
# One SM: every local expert in one receive block (at 256 experts, several
# list batches of the LSA receive, kMepBatchUnits); the hot-expert
# cases put 2048 slots into that block.
ll_gpu_one_sm() {
  MOE_EP_TEST_SMS=1 timeout $((120 * S)) $B/ll_gpu_test \
    --gtest_filter='*Hot*:*LsaFp8H7168*:*GinEmuFp8H7168*:*Repeated*:*LsaExpertLists*:*DoubleBuffered*' \
    > "$OUT/ll_gpu_test_sms1.log" 2>&1
  summary ll_gpu_test_sms1 $? "$(gtest_key "$OUT/ll_gpu_test_sms1.log")"
}
# The LL and HT kernels at 3, 4 and 8 ranks on one GPU
# (tests/gpu/one_gpu_world.h): LSA, GIN-emulated (HT: node splits) against
# the oracle. Not under the sanitizers: they run kernels one at a time, and
# a group's ranks need theirs side by side.
ll_world() {
  timeout 300 $B/ll_world_test > "$OUT/ll_world_test.log" 2>&1
  summary ll_world_test $? "$(gtest_key "$OUT/ll_world_test.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|rank [0-9]+" "$OUT/ll_world_test.log" | head -12
}
# memcheck and racecheck on a small LL run over the nccl backend; 24
# tokens a rank, above the flagged limit (16 at EP2, fewer beyond), so the
# LSA combine sends line partials, and with the generator of empty and
# short ranks, flagged words and mixed calls too.
ll_sanitizers() {
  local tool
  for tool in memcheck racecheck; do
    sanitize $tool $tool $N $((120 * S)) $B/conformance_worker --plugin=$B/libmoe_ep.so --backend=nccl \
      --experts=8 --max_tokens=24 --layers=256:2 --seeds=1 --hooks=0
  done
}
# The first LL API runs against the oracle: LSA fp8 without and with
# weights given to dispatch (expert-side partials), and GIN-emulated with
# weights on even ranks only.
ll_api_core() {
  api ${E}_lsa_fp8 $N $((50 * S)) --experts=256 --max_tokens=128 --dtype=fp8 --layers=7168:8,2048:1 --seeds=1
  api ${E}_lsa_fp8_dispatch_weights $N $((50 * S)) --experts=256 --max_tokens=128 --dtype=fp8 \
    --layers=7168:8,2048:1 --seeds=2 --dispatch_weights=1
  api ${E}_ginemu_dispatch_weights_mixed $N $((50 * S)) --transport=gin_emulated --experts=64 \
    --max_tokens=64 --layers=4096:8,2048:2 --seeds=2 --dispatch_weights=mixed
}
# LL scenarios: two-batch overlap (hooks run and handles freed on a second
# host thread while the first dispatches and combines the other
# micro-batch), a combine hook on a second stream held back while the next
# combine on its set is issued, one buffer set, and a skipped rank's
# timeout.
ll_scenarios() {
  api ${E}_threads $N $((60 * S)) --scenario=threads --iterations=100 --experts=64 --max_tokens=32 \
    --dtype=fp8 --layers=2048:8 --dispatch_weights=mixed
  api ${E}_streams $N $((30 * S)) --scenario=streams --experts=64 --max_tokens=32 --dtype=fp8 \
    --layers=2048:8 --seeds=10 --dispatch_weights=mixed
  MOE_EP_DOUBLE_BUFFER=false api ${E}_single_set $N $((30 * S)) --experts=64 --max_tokens=32 \
    --layers=2048:8 --seeds=1 --hooks=0
  api ${E}_skip_timeout $N $((20 * S)) --scenario=skip --experts=8 --max_tokens=8 --layers=128:2 --kernel_ms=2000
}
# One gtest binary of the bundle: its log, its summary line, its verdicts
# (name seconds).
gtest_step() {
  timeout "$2" $B/$1 > "$OUT/$1.log" 2>&1
  summary "$1" $? "$(gtest_key "$OUT/$1.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|rank [0-9]+" "$OUT/$1.log" | head -12
}
world_tests() {
  ll_world
  # A dispatch reusing its set while the combine of the set's last dispatch
  # is still to be received and a peer has yet to receive that dispatch.
  gtest_step ll_world_reuse_test 120
  # Two pending dispatches combined in different orders on the two ranks.
  gtest_step ll_world_order_test 120
  # The abort flag a failed group's teardown raises ends a waiting receive.
  gtest_step ll_world_abort_test 120
  # Ranks whose dispatches differ in hidden, top_k or row format.
  gtest_step ll_world_shape_test 120
  gtest_step ht_world_test 300
  # Ranks whose calls differ in hidden, top_k or row format.
  gtest_step ht_world_shape_test 120
  # The same with calls free-running across ranks (a rank a call ahead).
  gtest_step ht_world_overlap_test 300
}
# quick's public-API half: the kernel test at world 1 (on the first GPU),
# then the API runs against the oracle: both combine modes, graphs, and
# bf16 hidden sizes that are not multiples of 128.
quick_api() {
  # (44 cases: 54 s on a 1-GPU H200 machine, 70 s on the first GPU of a
  # 2-GPU one; the limit is ll_gpu_test's.)
  MOE_EP_TEST_WORLD=1 timeout $((120 * S)) $B/ll_gpu_test > "$OUT/ll_gpu_test_world1.log" 2>&1
  summary ll_gpu_test_world1 $? "$(gtest_key "$OUT/ll_gpu_test_world1.log")"
  ll_api_core
  # Weights given to dispatch, in CUDA-graph replays.
  api ${E}_graph_dispatch_weights $N $((40 * S)) --scenario=graph --experts=64 --max_tokens=32 \
    --layers=2048:8 --seeds=100 --dispatch_weights=1
  # bf16 hidden a multiple of 8 but not of 128 (2880: gpt-oss; 1032, 2056)
  # in both combine modes, bit-exact against the oracle: LSA with weights at
  # combine and at dispatch, GIN-emulated with weights at combine and on even
  # ranks only (one rank of each mode in the same run).
  api ${E}_lsa_bf16_h2880 $N $((50 * S)) --dtype=bf16 --experts=64 --max_tokens=128 \
    --layers=2880:9,1032:4 --seeds=2
  api ${E}_lsa_bf16_h2880_dispatch_weights $N $((50 * S)) --dtype=bf16 --experts=64 --max_tokens=128 \
    --layers=2880:9,1032:4 --seeds=2 --dispatch_weights=1
  api ${E}_ginemu_bf16_h2880 $N $((50 * S)) --transport=gin_emulated --dtype=bf16 --experts=64 \
    --max_tokens=64 --layers=2880:4,2056:8 --seeds=2
  api ${E}_ginemu_bf16_h2880_dispatch_weights_mixed $N $((50 * S)) --transport=gin_emulated --dtype=bf16 \
    --experts=64 --max_tokens=64 --layers=2880:4,2056:8 --seeds=2 --dispatch_weights=mixed
}
# The libraries an A/B compares, one "name folder" line each: this
# bundle's (cur) and every variant's under $B/ab/<name>/. Variants may
# travel packed (a bundle has a size limit): ab.tar.xz holds ab/.
variants() {
  [ -f $B/ab.tar.xz ] && tar xJf $B/ab.tar.xz -C $B
  local D
  for D in $B $B/ab/*; do
    [ -f "$D/libmoe_ep.so" ] || continue
    if [ "$D" = $B ]; then echo "cur $D"; else echo "$(basename "$D") $D"; fi
  done
}
# ab's token counts, and the flags of its extra bench cases beside the
# default one; both may come from the environment (a narrower A/B, such as
# small calls at EP4 in both combine modes). AB_STAMPS=0 skips the stamps;
# AB_ROUNDS sets how many times the variants take turns (differences of
# 0.2-0.3 us need more than two); AB_DTYPE=bf16 compares bf16 dispatches
# (the bench and the stamps) instead of fp8.
AB_TOKENS=${AB_TOKENS:-1,8,32,128,256}
AB_DTYPE=${AB_DTYPE:-fp8}
AB_ROUNDS=${AB_ROUNDS:-2}
AB_EXTRAS=${AB_EXTRAS-"--num_sms=24 --experts=1024 --dispatch_weights=false"}
# The ab runs' table: per case (the extra flag), token count and variant,
# each half's p50 range over the ranks and rounds of
# bench_<variant>[_<extra>]_<round>.log (AB_DTYPE's latency rows), sorted so each
# variant's line sits under the others'; then, for each variant beside
# cur, its ranges' like ends minus cur's (low - low / high - high, us;
# positive: the variant is slower).
# How ab_table and ab_tails read the bench logs: the variant (with its
# extra) of bench_<variant>[_<extra>]_<round>.log, and AB_DTYPE's latency
# rows split on "|" into part[] (the bandwidth table has no p50/p99).
AB_LOG_AWK='
  function ab_variant(f) {
    sub(/.*\/bench_/, "", f); sub(/\.log$/, "", f); sub(/_[0-9]+$/, "", f)
    return f
  }
  function ab_latency_row(dtype, part) {
    return $1 == dtype && $5 == "|" && split($0, part, "|") >= 7 && index(part[2], "/") > 0
  }
'
ab_table() {
  local extras
  extras=$(echo $AB_EXTRAS | sed 's/--//g; s/ /|/g')
  awk -v extras="$extras" -v dtype="$AB_DTYPE" "$AB_LOG_AWK"'
    FNR == 1 {
      v = ab_variant(FILENAME)
      extra = "weights_at_dispatch"
      if (match(v, "_(" extras ")$")) {
        extra = substr(v, RSTART + 1); v = substr(v, 1, RSTART - 1)
      }
    }
    ab_latency_row(dtype, part) {
      key = extra SUBSEP $3 SUBSEP v
      seen[key] = 1
      for (c = 1; c <= 6; c++) {
        split(part[c + 1], pv, "/"); x = pv[1] + 0
        if (!((key, c) in lo) || x < lo[key, c]) lo[key, c] = x
        if (!((key, c) in hi) || x > hi[key, c]) hi[key, c] = x
      }
    }
    END {
      split("disp comb d.send d.recv c.send c.recv", name, " ")
      for (key in seen) {
        split(key, k, SUBSEP)
        line = sprintf("%-22s %5d %-12s", k[1], k[2], k[3])
        for (c = 1; c <= 6; c++) line = line sprintf("  %s %.1f-%.1f", name[c], lo[key, c], hi[key, c])
        print "0 " line
        ref = k[1] SUBSEP k[2] SUBSEP "cur"
        if (k[3] == "cur" || !(ref in seen)) continue
        line = sprintf("%-22s %5d %-12s", k[1], k[2], k[3] "-cur")
        for (c = 1; c <= 6; c++)
          line = line sprintf("  %s %+.1f/%+.1f", name[c], lo[key, c] - lo[ref, c], hi[key, c] - hi[ref, c])
        print "1 " line
      }
    }' "$OUT"/bench_*.log | sort -k1,1n -k2,2 -k3,3n -k4,4 | cut -c3-
}
# The ab runs' tails: per variant and case, the largest p99/p50 of the
# dispatch and combine columns over its ranks, rounds and token counts,
# with the row that has it (the LL speed bound is p99 within 1.2x p50; a
# change can keep the median and lose the tail).
ab_tails() {
  awk -v dtype="$AB_DTYPE" "$AB_LOG_AWK"'
    FNR == 1 { v = ab_variant(FILENAME) }
    ab_latency_row(dtype, part) {
      for (c = 1; c <= 2; c++) {
        split(part[c + 1], pv, "/")
        if (pv[1] + 0 <= 0) continue
        r = (pv[2] + 0) / (pv[1] + 0)
        if (!(v in worst) || r > worst[v]) {
          worst[v] = r
          where[v] = sprintf("%s at %d tokens, rank %d: %.1f / %.1f", c == 1 ? "dispatch" : "combine",
                             $3, $4, pv[1], pv[2])
        }
      }
    }
    END { for (v in worst) printf "%-40s p99/p50 %.2f (%s)\n", v, worst[v], where[v] }
  ' "$OUT"/bench_*.log | sort
}
# ab: this bundle against each variant under .gpu_bundle/ab/<name>/ (a
# libmoe_ep.so, and ll_kernel_bench where dispatch changed, built from
# another tree: tools/ab_variant.sh) on the group's
# GPUs (EP1 on a 1-GPU machine), taking turns so drift hits all: the fused
# dispatch's phase stamps, then the eager bench (both combine modes); it
# ends with ab_table's ranges (also in $OUT/ab_table.txt) and ab_tails'
# worst p99/p50 per variant ($OUT/ab_tails.txt).
if [ "$MODE" = ab ]; then
  mapfile -t V < <(variants)
  for round in $(seq "$AB_ROUNDS"); do
    for v in "${V[@]}"; do
      name=${v%% *} D=${v#* }
      # (a variant without its own ll_kernel_bench changed no dispatch code)
      if [ -f "$D/ll_kernel_bench" ] && [ "${AB_STAMPS:-1}" = 1 ]; then
        phases=phases; [ "$AB_DTYPE" = bf16 ] && phases=phases_bf16
        timeout $((60 * S)) $D/ll_kernel_bench $phases > "$OUT/stamps_${name}_$round.log" 2>&1
        summary "stamps_${name}_$round" $?
        grep -E "^PHASES rank 0" "$OUT/stamps_${name}_$round.log" | sed "s/^/$name $round: /"
      fi
      bench "bench_${name}_$round" 90 --plugin=$D/libmoe_ep.so --dtype=$AB_DTYPE \
        --tokens=$AB_TOKENS --warmup=50
      grep -E "^$AB_DTYPE .*\| .*\| " "$OUT/bench_${name}_$round.log" | head -10 | cut -c1-116 | sed "s/^/$name $round: /"
      # several local experts per receive block (a 24-SM grid, and 1024
      # experts); the combine with the weights given at combine (pushed to
      # the experts' ranks over LSA)
      for extra in $AB_EXTRAS; do
        tok=1,128; [ $extra = --dispatch_weights=false ] && tok=$AB_TOKENS
        bench "bench_${name}_${extra#--}_$round" 90 --plugin=$D/libmoe_ep.so --dtype=$AB_DTYPE \
          --tokens=$tok --warmup=50 $extra
        grep -E "^$AB_DTYPE .*\| .*\| " "$OUT/bench_${name}_${extra#--}_$round.log" | head -10 | cut -c1-116 | sed "s/^/$name $round $extra: /"
      done
    done
  done
  ab_table | tee "$OUT/ab_table.txt"
  ab_tails | tee "$OUT/ab_tails.txt"
  # the gaps between the stamped phases, per build (tools/bench/phase_deltas.py)
  if ls "$OUT"/stamps_*_*.log > /dev/null 2>&1; then
    python3 tools/bench/phase_deltas.py "$OUT"/stamps_*_*.log | tee "$OUT/phase_deltas.txt"
  fi
  cat "$OUT/summary.txt"
  exit 0
fi
# htab: the HT bench (EP2 shape of the issue: 4096 tokens, hidden 7168,
# top-8, 256 experts, bf16, 24 SMs; LSA) for this bundle and each variant
# under .gpu_bundle/ab/<name>/libmoe_ep.so, taking turns over three rounds,
# after each variant's HT API runs against the oracle (LSA and nodes of
# N/2 over gin_emulated).
if [ "$MODE" = htab ]; then
  mapfile -t V < <(variants)
  R2=1; [ "$N" -gt 2 ] && R2=$((N / 2))
  for v in "${V[@]}"; do
    name=${v%% *} D=${v#* }
    PLUGIN=$D/libmoe_ep.so api ht_${E}_${name}_bf16 $N $((90 * S)) --mode=ht --experts=64 \
      --max_tokens=512 --layers=7168:8,2880:6,4096:1 --seeds=2
    PLUGIN=$D/libmoe_ep.so api ht_${E}_${name}_ginemu $N $((90 * S)) --mode=ht \
      --transport=gin_emulated --ranks_per_node=$R2 --experts=64 --max_tokens=512 \
      --layers=7168:8,2048:1 --seeds=1
  done
  for round in 1 2 3; do
    for v in "${V[@]}"; do
      name=${v%% *} D=${v#* }
      bench "htbench_${name}_$round" 90 --plugin=$D/libmoe_ep.so --mode=ht --dtype=bf16 \
        --tokens=4096 --num_sms=24
      grep -E "^bf16 " "$OUT/htbench_${name}_$round.log" | sed "s/^/$name $round: /"
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# extra: the NVLink probe (launch floors, eager and in a graph; the
# two-GPU row-and-flag exchange under a 1-token dispatch), the reduction
# probe (the combine send's expert-row loads and partial stores alone,
# with and without the link) and the dispatch's cost against the expert
# count (the send lists every expert: 256, 1024 and
# 1024 * N experts, i.e. up to the 1024 local experts of the limit).
if [ "$MODE" = extra ]; then
  timeout 120 $B/nvlink_probe 1000 > "$OUT/probe.log" 2>&1
  summary nvlink_probe $?
  cat "$OUT/probe.log"
  timeout 180 $B/reduce_probe --iters=300 > "$OUT/reduce_probe.log" 2>&1
  summary reduce_probe $?
  cat "$OUT/reduce_probe.log"
  for e in 256 1024 $((1024 * N)); do
    bench "bench_experts_$e" 90 --plugin=$B/libmoe_ep.so --dtype=fp8 --tokens=1,128,256 \
      --experts=$e --warmup=50
    grep -A8 "^latency" "$OUT/bench_experts_$e.log" | grep -E "^fp8" | cut -c1-110 | sed "s/^/E=$e: /"
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# The steps of rest outside the HT suite and the LL scenarios: the demo
# over the nccl backend, the GIN-emulated trace, GIN and a mismatched NCCL
# refused, EP1 bf16, the LSA link checks, the setup stalls, and
# group_create while the engine's work holds a stream (hold).
rest_misc() {
  sed 's/backend: host/backend: nccl/' $B/demo.yaml > "$OUT/demo_nccl.yaml"
  timeout $((30 * S)) $B/moe_ep_run -n $N -- $B/moe_ep_demo --config "$OUT/demo_nccl.yaml" \
    --plugin $B/libmoe_ep.so --steps 50 --verify > "$OUT/demo.log" 2>&1
  summary demo $? "$(awk '$1 ~ /^[0-9]+$/ && NF >= 8 { split($NF, v, "/"); ok += v[1]; all += v[2] }
    END { printf "%d of %d combines verified", ok, all }' "$OUT/demo.log")"; tail -3 "$OUT/demo.log"
  MOE_EP_TEST_TRACE=1 api ${E}_ginemu_trace $N $((25 * S)) --transport=gin_emulated --experts=256 \
    --max_tokens=128 --layers=7168:8 --seeds=1 --hooks=0 --kernel_ms=3000
  # GIN requested where no RDMA NIC exists: group_create refuses with NCCL's
  # reason, no hang.
  api_refused gin_request $N $((15 * S)) 'GIN not supported' --transport=gin --experts=8 --max_tokens=8 --layers=128:2
  # A runtime NCCL other than the headers' (the system's copy): group_create
  # must refuse, naming both versions.
  MOE_EP_NCCL_LIBRARY=/usr/lib/x86_64-linux-gnu/libnccl.so.2 api_refused nccl_version_refused $N $((15 * S)) \
    version --experts=8 --max_tokens=8 --layers=128:2
  api ep1_bf16 1 20 --experts=8 --max_tokens=64 --layers=2048:2 --seeds=1
  lsa_link_checks
  setup_stalls
  held_stream_creates
}
# hold: group_create and group_destroy while the engine's GPU work has not
# ended. A host function holds the legacy default stream for up to 20 s
# (worker_hold.cc). On the engine's communicator (--adopt_comm=1, made and
# used once before the hold) a rank whose group_create or group_destroy
# returns only after the hold expired is a FAIL line: LL over LSA and
# GIN-emulated, HT, and LL with a nonblocking stream held instead; then
# group_destroy while the group's own dispatch waits behind a held stream. On a communicator of its own,
# NCCL's ncclCommInitRankConfig waits for the whole device
# (tools/bench/RESULTS.md): that create runs with every setup step logged
# and stamped as it arrives, reported, not judged. Every group then runs
# its oracle checks. Last, which CUDA and NCCL host calls wait for a held
# stream (tools/probe/hold_probe.cu).
held_stream_creates() {
  local a="--hold_ms=20000 --experts=8 --max_tokens=8 --layers=128:2 --seeds=1"
  api ${E}_adopted_create_held_stream $N 60 $a --adopt_comm=1
  api ${E}_ginemu_adopted_create_held_stream $N 60 $a --adopt_comm=1 --transport=gin_emulated
  api ht_${E}_adopted_create_held_stream $N 60 $a --adopt_comm=1 --mode=ht
  # an engine's side stream held instead (nonblocking)
  api ${E}_adopted_create_held_side_stream $N 60 $a --adopt_comm=1 --hold_stream=nonblocking
  # Every kernel loaded at group_create on a communicator of the group's
  # own: LL round trips (fused and hooks, every routing) with an engine's
  # side stream held return, call by call, while it is held.
  api ${E}_first_launch_held_side_stream $N 60 --scenario=first_launch_held --hold_ms=20000 \
    --experts=64 --max_tokens=64 --layers=2048:8 --seeds=1
  api ${E}_ginemu_first_launch_held_side_stream $N 60 --scenario=first_launch_held \
    --hold_ms=20000 --transport=gin_emulated --experts=64 --max_tokens=64 --layers=2048:8 --seeds=1
  # group_destroy with the group's own dispatch queued behind a held
  # stream: TIMEOUT within bootstrap.timeout_ms, the memory left for it.
  api ${E}_destroy_behind_held_dispatch $N 60 --scenario=destroy_behind --hold_ms=8000 \
    --boot_ms=3000 --experts=8 --max_tokens=8 --layers=128:2 --seeds=1
  # An HT dispatch whose kernel waits behind a held stream: TIMEOUT after
  # bootstrap.timeout_ms instead of waiting to learn its row count.
  api ht_${E}_count_behind_held_stream $N 60 --mode=ht --scenario=ht_count_behind \
    --hold_ms=8000 --boot_ms=3000 --experts=8 --max_tokens=8 --layers=128:2 --seeds=1
  # A bash read loop stamps the lines (awk reads a pipe in blocks).
  timeout 65 $B/moe_ep_run -n $N --timeout_s 60 -- $B/conformance_worker \
    --plugin=${PLUGIN:-$B/libmoe_ep.so} --backend=nccl --barrier_dir="$(mktemp -d)" $a \
    --log_level=debug 2>&1 \
    | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%3N)" "$line"; done \
    > "$OUT/hold_steps.log"
  summary hold_steps "${PIPESTATUS[0]}" \
    "$(sed 's/^[0-9.]* //' "$OUT/hold_steps.log" | worker_key /dev/stdin)"
  grep -E "setup:|held|group_create|FAIL" "$OUT/hold_steps.log" | head -40
  timeout 200 $B/hold_probe --hold_ms=2000 > "$OUT/hold_probe.log" 2>&1
  summary hold_probe $? "$(grep -c "waited for the hold" "$OUT/hold_probe.log") calls waited"
  cat "$OUT/hold_probe.log"
}
# A rank that stops in NCCL setup (the stand-in libnccl_stall.so holds it
# 10 s at one step) must not hold the others: with bootstrap.timeout_ms
# 2000 every other rank's group_create returns TIMEOUT naming itself and
# the step well before the stalled rank arrives, and the stalled rank's
# fails too. The steps: the communicator's creation, the link check's
# all-gather, the window's registration, the device communicator and the
# closing barrier (the second all-reduce); LL, and HT at the barrier.
setup_stalls() {
  local step
  for step in ncclCommInitRankConfig:1 ncclAllGather:1 ncclCommWindowRegister:1 \
              ncclDevCommCreate:1 ncclAllReduce:2; do
    MOE_EP_NCCL_LIBRARY=$B/libnccl_stall.so MEP_STALL=1:$step:10000 \
      api ${E}_setup_stall_${step%%:*} $N 60 --scenario=setup_stall --boot_ms=2000 \
      --experts=8 --max_tokens=8 --layers=128:2
  done
  MOE_EP_NCCL_LIBRARY=$B/libnccl_stall.so MEP_STALL=1:ncclAllReduce:1:10000 \
    api ht_${E}_setup_stall_barrier $N 60 --scenario=setup_stall --mode=ht --boot_ms=2000 \
    --experts=8 --max_tokens=8 --layers=128:2
}
# The LSA link check (runtime/nccl/lsa_link.h): here NVML must find NVLink,
# so auto stays on LSA (the INFO line names the transport and the link);
# told the links are PCIe (MOE_EP_LSA_LINK=pcie), auto must run
# gin_emulated, exact against the oracle and saying so, and transport lsa
# must be refused; an unknown MOE_EP_LSA_LINK is refused by name.
lsa_link_checks() {
  api ${E}_lsa_link_detect $N $((30 * S)) --experts=64 --max_tokens=32 --dtype=fp8 --layers=7168:8 \
    --seeds=1 --log_level=info
  local hits
  # occurrences, not lines: the ranks share one stderr
  hits=$(grep -o "LL transport lsa; the LSA team's worst link: NVLink" "$OUT/api_${E}_lsa_link_detect.log" | wc -l)
  [ "$hits" = "$N" ]; summary lsa_link_detect_says_nvlink $? "$hits of $N ranks: LSA over NVLink"
  MOE_EP_LSA_LINK=pcie api ${E}_lsa_link_pcie_auto $N $((30 * S)) --experts=64 --max_tokens=32 \
    --dtype=fp8 --layers=7168:8,2048:2 --seeds=2 --dispatch_weights=mixed
  hits=$(grep -o "LL runs gin_emulated there" "$OUT/api_${E}_lsa_link_pcie_auto.log" | wc -l)
  [ "$hits" = "$N" ]; summary lsa_link_pcie_auto_warns $? "$hits of $N ranks warned"
  MOE_EP_LSA_LINK=pcie api_refused lsa_link_pcie_lsa $N $((15 * S)) 'transport lsa needs NVLink' \
    --transport=lsa --experts=8 --max_tokens=8 --layers=128:2
  MOE_EP_LSA_LINK=bogus api_refused lsa_link_bad_value $N $((15 * S)) "MOE_EP_LSA_LINK is 'bogus'" \
    --experts=8 --max_tokens=8 --layers=128:2
}
# HT (prefill) on the nccl backend, public API against the oracle: bf16 and
# pre-quantised fp8 (f32, UE8M0, packed scales), top-k 1..32, hidden 2048
# to 7168 and 2880, 1 to 4096 tokens per rank, uniform / skewed / all to
# one rank / empty ranks / masked routing, hooks, a second dispatch on one
# handle, worst-case sizing; bad input; EP1; the LL handle's DeepEP layout;
# memcheck and racecheck; the HT bench. Also run by `full`.
ht_suite() {
  ht_lsa_suite
  ht_net_suite
  ht_bench_suite
}
# Pre-quantised rows with one f32 scale per token (MOE_EP_FORMAT_FP8_PER_TOKEN).
ht_per_token() {
  api ht_${E}_fp8_per_token $N $((90 * S)) --mode=ht --per_call_format=1 --dtype=fp8 \
    --scale=per_token --experts=64 --max_tokens=256 --layers=7168:8,128:2 --seeds=2
  api ht_${E}_worst_case_fp8_per_token $N $((90 * S)) --mode=ht --worst_case=1 --per_call_format=1 \
    --dtype=fp8 --scale=per_token --experts=64 --max_tokens=64 --layers=2048:8 --seeds=1
}
ht_per_token_ginemu() {
  api ht_${E}_ginemu_fp8_per_token $N $((90 * S)) --mode=ht --transport=gin_emulated \
    --per_call_format=1 --dtype=fp8 --scale=per_token --experts=64 --max_tokens=256 \
    --layers=7168:8,4096:4 --seeds=1
}
ht_lsa_suite() {
  api ht_${E}_bf16 $N $((90 * S)) --mode=ht --experts=64 --max_tokens=64 --layers=2048:8,2880:6,4096:1 --seeds=2
  api ht_${E}_fp8_f32 $N $((90 * S)) --mode=ht --dtype=fp8 --scale=f32 --experts=256 --max_tokens=512 \
    --layers=7168:8,4096:32 --seeds=1
  api ht_${E}_fp8_packed_per_call $N $((90 * S)) --mode=ht --per_call_format=1 --dtype=fp8 \
    --scale=ue8m0_packed --experts=32 --max_tokens=7 --layers=2048:6,640:3 --seeds=2
  ht_per_token
  api ht_${E}_worst_case $N $((90 * S)) --mode=ht --worst_case=1 --experts=64 --max_tokens=128 \
    --layers=7168:8,2880:2 --seeds=2
  api ht_${E}_big $N $((240 * S)) --mode=ht --experts=256 --max_tokens=4096 --layers=7168:8 --seeds=1
  # the largest bench size, 8192 tokens per rank, against the oracle
  api ht_${E}_8192 $N $((300 * S)) --mode=ht --experts=256 --max_tokens=8192 --layers=7168:8 --seeds=1
  api ht_${E}_one_token $N $((60 * S)) --mode=ht --experts=8 --max_tokens=1 --layers=2048:1,128:8 --seeds=2
  api ht_${E}_bad $N $((60 * S)) --scenario=htbad --mode=ht --experts=8 --max_tokens=16 --layers=256:2
  api ht_${E}_skip_timeout $N $((20 * S)) --scenario=skip --mode=ht --experts=8 --max_tokens=8 \
    --layers=128:2 --kernel_ms=2000
  api ht_ep1 1 60 --mode=ht --experts=16 --max_tokens=256 --layers=7168:8,2880:4 --seeds=1
}
# The HT suite's second part: the network protocol, the layout runs and
# the sanitizers (htnet runs it alone, where a time limit stops ht early).
ht_net_suite() {
  # The network protocol (staged puts, signals as ring counters) over
  # NVLink: 2 GPUs as 2 nodes of one GPU, and as one node of 2 (every peer
  # on this node: the stores of the LSA path in the same kernel).
  api ht_${E}_ginemu_bf16 $N $((90 * S)) --mode=ht --transport=gin_emulated --experts=64 --max_tokens=64 \
    --layers=2048:8,2880:6,4096:1 --seeds=2
  api ht_${E}_ginemu_fp8_packed $N $((90 * S)) --mode=ht --transport=gin_emulated --dtype=fp8 \
    --scale=ue8m0_packed --experts=256 --max_tokens=512 --layers=7168:8,4096:32 --seeds=1
  ht_per_token_ginemu
  api ht_${E}_ginemu_worst_case $N $((90 * S)) --mode=ht --transport=gin_emulated --worst_case=1 \
    --experts=64 --max_tokens=128 --layers=7168:8,2880:2 --seeds=2
  api ht_${E}_ginemu_big $N $((240 * S)) --mode=ht --transport=gin_emulated --experts=256 \
    --max_tokens=4096 --layers=7168:8 --seeds=1
  api ht_${E}_ginemu_8192 $N $((300 * S)) --mode=ht --transport=gin_emulated --experts=256 \
    --max_tokens=8192 --layers=7168:8 --seeds=1
  api ht_${E}_ginemu_one_node $N $((90 * S)) --mode=ht --transport=gin_emulated --ranks_per_node=$N \
    --experts=64 --max_tokens=64 --layers=2048:8,2880:6 --seeds=2
  # From 4 ranks on, nodes of 2 (and of 4 at 8): LSA peers and network
  # peers in one kernel.
  for rpn in 2 4; do
    [ "$N" -gt "$rpn" ] && [ $((N % rpn)) = 0 ] || continue
    api ht_${E}_ginemu_nodes_of_$rpn $N $((90 * S)) --mode=ht --transport=gin_emulated \
      --ranks_per_node=$rpn --experts=64 --max_tokens=64 --layers=2048:8,2880:6 --seeds=2
  done
  api ht_${E}_ginemu_skip_timeout $N $((20 * S)) --scenario=skip --mode=ht --transport=gin_emulated \
    --experts=8 --max_tokens=8 --layers=128:2 --kernel_ms=2000
  api ht_ep1_ginemu 1 60 --mode=ht --transport=gin_emulated --experts=16 --max_tokens=256 \
    --layers=7168:8 --seeds=1
  # Real GIN where no RDMA NIC exists: refused with NCCL's reason, no hang.
  api_refused ht_gin_request $N $((15 * S)) 'GIN not supported' --mode=ht --transport=gin --experts=8 \
    --max_tokens=8 --layers=128:2
  api ll_${E}_layout $N $((60 * S)) --scenario=layout --experts=8 --max_tokens=16 --layers=256:2,128:1
  api ll_${E}_layout_fp8 $N $((60 * S)) --scenario=layout --experts=64 --max_tokens=64 --dtype=fp8 \
    --layers=7168:8
  for tool in memcheck racecheck; do
    sanitize "ht_$tool" $tool $N $((120 * S)) $B/conformance_worker --plugin=$B/libmoe_ep.so \
      --backend=nccl --mode=ht --experts=8 --max_tokens=40 --layers=256:2 --seeds=1 --hooks=0
    sanitize "ht_ginemu_$tool" $tool $N $((120 * S)) $B/conformance_worker --plugin=$B/libmoe_ep.so \
      --backend=nccl --mode=ht --transport=gin_emulated --experts=8 --max_tokens=40 \
      --layers=256:2 --seeds=1 --hooks=0
  done
}
ht_bench_suite() {
  bench bench_ht 240 --plugin=$B/libmoe_ep.so --mode=ht --dtype=bf16 \
    --tokens=512,1024,2048,4096,8192 --num_sms=24 --json="$OUT/bench_ht.json"
  grep -A14 "^high-throughput" "$OUT/bench_ht.log"
  # 32 SMs (16 channels, the most the window has rings for)
  bench bench_ht_sms32 120 --plugin=$B/libmoe_ep.so --mode=ht --dtype=bf16 --tokens=4096 \
    --num_sms=32
  grep -E "^bf16 " "$OUT/bench_ht_sms32.log"
  # The network protocol over NVLink (every row staged, then put)
  bench bench_ht_ginemu 120 --plugin=$B/libmoe_ep.so --mode=ht --transport=gin_emulated \
    --dtype=bf16 --tokens=4096 --num_sms=24
  grep -E "^bf16 " "$OUT/bench_ht_ginemu.log"
}
# scale: a short GPU run, most wanted first: HT across
# nodes (gin_emulated as nodes of N/2: NVLink peers and network peers in
# one kernel, through relays; at 2 ranks nodes of 1), HT and LL at N ranks
# against the oracle, memcheck of the network path, the benches at N ranks
# (relays' speed included), then the EP2 benches on GPUs 0 and 1.
if [ "$MODE" = scale ]; then
  R2=1; [ "$N" -gt 2 ] && R2=$((N / 2))
  api ht_${E}_ginemu_nodes_of_$R2 $N $((90 * S)) --mode=ht --transport=gin_emulated \
    --ranks_per_node=$R2 --experts=64 --max_tokens=64 --layers=2048:8,2880:6 --seeds=2
  api ht_${E}_ginemu_nodes_of_${R2}_fp8_packed $N $((90 * S)) --mode=ht --transport=gin_emulated \
    --ranks_per_node=$R2 --dtype=fp8 --scale=ue8m0_packed --experts=256 --max_tokens=512 \
    --layers=7168:8,4096:32 --seeds=1
  api ht_${E}_ginemu_nodes_of_${R2}_worst_case $N $((90 * S)) --mode=ht --transport=gin_emulated \
    --ranks_per_node=$R2 --worst_case=1 --experts=64 --max_tokens=128 --layers=7168:8,2880:2 --seeds=2
  api ht_${E}_ginemu_nodes_of_${R2}_skip_timeout $N $((20 * S)) --scenario=skip --mode=ht \
    --transport=gin_emulated --ranks_per_node=$R2 --experts=8 --max_tokens=8 --layers=128:2 \
    --kernel_ms=2000
  api ht_${E}_bf16 $N $((90 * S)) --mode=ht --experts=64 --max_tokens=64 --layers=2048:8,2880:6,4096:1 --seeds=2
  api ${E}_lsa_fp8_dispatch_weights $N $((50 * S)) --experts=256 --max_tokens=128 --dtype=fp8 \
    --layers=7168:8,2048:1 --seeds=2 --dispatch_weights=1
  api ${E}_ginemu_dispatch_weights_mixed $N $((50 * S)) --transport=gin_emulated --experts=64 \
    --max_tokens=64 --layers=4096:8,2048:2 --seeds=2 --dispatch_weights=mixed
  sanitize ht_ginemu_nodes_of_${R2}_memcheck memcheck $N $((120 * S)) $B/conformance_worker \
    --plugin=$B/libmoe_ep.so --backend=nccl --mode=ht --transport=gin_emulated --ranks_per_node=$R2 \
    --experts=8 --max_tokens=40 --layers=256:2 --seeds=1 --hooks=0
  sizes=$N; [ "$N" -gt 2 ] && sizes="$N 2"
  for n in $sizes; do
    for t in lsa nodes; do
      rpn=; tr=auto
      [ $t = nodes ] && { rpn=$(( n > 2 ? n / 2 : 1 )); tr=gin_emulated; }
      MOE_EP_RANKS_PER_NODE=$rpn BENCH_RANKS=$n bench bench_ht_ep${n}_$t 120 \
        --plugin=$B/libmoe_ep.so --mode=ht --transport=$tr --dtype=bf16 --tokens=1024,4096 \
        --num_sms=24
      grep -E "^bf16 " "$OUT/bench_ht_ep${n}_$t.log"
    done
    for w in true false; do
      BENCH_RANKS=$n bench bench_ep${n}_dispatch_weights_$w 90 --plugin=$B/libmoe_ep.so \
        --warmup=50 --dispatch_weights=$w
      grep -A22 "^latency" "$OUT/bench_ep${n}_dispatch_weights_$w.log" | grep -E "^(fp8|bf16) "
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# ncu on every rank at once over moe_ep_bench (name what kernel-regex
# launch-skip launch-count bench-args...): `what` is counters (duration,
# DRAM bytes, SM activity) or stalls (the warp stall reasons of PC
# sampling). No replay is asked for, so each profiled kernel runs once and
# the ranks' kernels still meet; the profiler's start-up skews the ranks,
# which inflates the durations of kernels that wait for a peer, not the
# shares of the stall reasons. CSV per rank: ncu_<name>_<what>_rank<r>.csv.
ncu_step() {
  local name=$1 what=$2 kern=$3 skip=$4 count=$5 m r
  shift 5
  m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_active.avg
  if [ "$what" = stalls ]; then
    m=smsp__pcsamp_sample_count
    for r in long_scoreboard lg_throttle membar barrier branch_resolving wait no_instructions \
             math_pipe_throttle mio_throttle short_scoreboard not_selected selected sleeping \
             dispatch_stall drain misc imc_miss tex_throttle; do
      m=$m,smsp__pcsamp_warps_issue_stalled_$r
    done
  fi
  timeout $((150 * S)) $B/moe_ep_run -n $N --timeout_s $((145 * S)) -- bash -c \
    'ncu --clock-control none --metrics "$1" -k "regex:$2" --launch-skip "$3" \
       --launch-count "$4" --csv --log-file "$5_rank$MOE_EP_RANK.csv" "${@:6}"' \
    ncu_step "$m" "$kern" "$skip" "$count" "$OUT/ncu_${name}_$what" \
    $B/moe_ep_bench --plugin=$B/libmoe_ep.so "$@" > "$OUT/ncu_${name}_$what.log" 2>&1
  summary "ncu_${name}_$what" $? \
    "$(cat "$OUT"/ncu_${name}_${what}_rank*.csv 2>/dev/null | grep -c '^"[0-9]') metric rows"
}
# htprof: where the HT kernels' time goes (4096 tokens, bf16, 24 SMs).
if [ "$MODE" = htprof ]; then
  for what in counters stalls; do
    ncu_step ht $what mep_ht_ 8 4 --mode=ht --dtype=bf16 --tokens=4096 --num_sms=24 \
      --iters=20 --warmup=4
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# llprof: the LL send halves (the hook path: they never wait for a peer,
# so the profiler's skew stays out of them): the combine send at 1 and 256
# tokens (partials, weights at dispatch) and the dispatch send at 1 token,
# fp8.
if [ "$MODE" = llprof ]; then
  for k in combine_send:256 dispatch_send:1 combine_send:1; do
    kern=${k%%:*} tok=${k#*:}
    for what in counters stalls; do
      ncu_step "${kern}_$tok" $what "ll_${kern}_kernel" 20 10 --dtype=fp8 --tokens=$tok \
        --iters=40 --warmup=10
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# sass: the SASS of the bundle's library and of every variant under
# .gpu_bundle/ab/<name>/ (cuobjdump), as sass_<name>.txt.gz, and per kernel
# whose name holds $SASS_KERNEL (default ll_combine) how many 128-bit
# loads each one has in flight beside it before its value is used
# (tools/bench/load_depth.py), in load_depth.txt. No GPU work.
if [ "$MODE" = sass ]; then
  while read -r name D; do
    cuobjdump -sass "$D/libmoe_ep.so" | gzip > "$OUT/sass_$name.txt.gz"
    summary "sass_$name" "${PIPESTATUS[0]}"
    echo "== $name" >> "$OUT/load_depth.txt"
    python3 tools/bench/load_depth.py "$OUT/sass_$name.txt.gz" \
      --kernel "${SASS_KERNEL:-ll_combine}" >> "$OUT/load_depth.txt"
  done < <(variants)
  cat "$OUT/load_depth.txt"
  exit 0
fi

# llpc: where the fused LL kernels' warps stall at 1 token, instruction by
# instruction; one GPU only (ncu's replay passes restore local memory, not
# a peer's). ncu's PC-sampled stall reasons per SASS instruction of one
# launch each of the fused fp8 dispatch (256 experts, and 128: one per
# receive block) and the fused combine (weights at dispatch), caches kept
# between passes as in the bench's loop; the CSVs as pc_<name>.csv.gz and
# each kernel's reason shares (tools/bench/pc_stalls.py) in pc_shares.txt.
if [ "$MODE" = llpc ]; then
  if [ "$N" != 1 ]; then echo "llpc runs at MEP_RANKS=1 (found $N)"; exit 2; fi
  for c in dispatch:ll_dispatch_kernel: dispatch_e128:ll_dispatch_kernel:--experts=128 \
           combine:ll_combine_kernel:; do
    name=${c%%:*} rest=${c#*:}
    kern=${rest%%:*} extra=${rest#*:}
    timeout 150 $B/moe_ep_run -n 1 --timeout_s 145 -- ncu --clock-control none \
      --cache-control none --section SourceCounters --section WarpStateStats \
      --warp-sampling-interval 0 -k "regex:$kern" --launch-skip 100 --launch-count 1 \
      -o "$OUT/pc_$name" -f $B/moe_ep_bench --plugin=$B/libmoe_ep.so --dtype=fp8 --tokens=1 \
      --warmup=20 --iters=200 $extra > "$OUT/pc_$name.log" 2>&1
    r=$?
    ncu -i "$OUT/pc_$name.ncu-rep" --page source --csv --print-source sass 2>> "$OUT/pc_$name.log" |
      gzip -9 > "$OUT/pc_$name.csv.gz"
    rm -f "$OUT/pc_$name.ncu-rep"
    summary "pc_$name" $r
    python3 tools/bench/pc_stalls.py "$OUT/pc_$name.csv.gz" --top 6 | tee -a "$OUT/pc_shares.txt"
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# lltable: the LL latency table, one command per row group: fp8 and bf16,
# 1-256 tokens, weights at dispatch and at combine, eager and one CUDA graph;
# then the 24-SM and 1024-expert cases and the fused dispatch's phase stamps;
# at EP2 the table against the LL speed targets (ll_targets.txt).
if [ "$MODE" = lltable ]; then
  for g in eager graph; do
    for w in true false; do
      gf=; [ $g = graph ] && gf=--graph
      bench "ll_${g}_weights_$w" 150 --plugin=$B/libmoe_ep.so --warmup=50 --dispatch_weights=$w \
        $gf --json="$OUT/ll_${g}_weights_$w.json"
      grep -A22 "^latency" "$OUT/ll_${g}_weights_$w.log" | grep -E "^(fp8|bf16) " | cut -c1-130
    done
  done
  for extra in --num_sms=24 --experts=1024; do
    bench "ll_${extra#--}" 90 --plugin=$B/libmoe_ep.so --dtype=fp8 --tokens=1,128 --warmup=50 \
      $extra
    grep -E "^fp8 .*\| .*\| " "$OUT/ll_${extra#--}.log" | cut -c1-130
  done
  timeout $((60 * S)) $B/ll_kernel_bench phases > "$OUT/ll_phases.log" 2>&1
  summary ll_phases $?
  grep -E "^PHASES rank 0" "$OUT/ll_phases.log"
  # the table against the LL speed targets (tools/bench/ll_targets.py)
  [ "$N" = 2 ] && python3 tools/bench/ll_targets.py "$OUT" | tee "$OUT/ll_targets.txt"
  cat "$OUT/summary.txt"
  exit 0
fi
# skew: the LL bench with hot experts (--routing_skew over SKEWS, 0 the
# uniform routing of every table), SKEW_DTYPE (fp8 unless set), both
# combine modes, eager: what the most-loaded expert's block costs the
# receive. With variants under .gpu_bundle/ab/ (as for ab) each takes its
# turn at every skew.
if [ "$MODE" = skew ]; then
  mapfile -t V < <(variants)
  dt=${SKEW_DTYPE:-fp8}
  for sk in ${SKEWS:-0 0.25 0.5}; do
    for w in true false; do
      for v in "${V[@]}"; do
        name=${v%% *} D=${v#* }
        log="skew_${name}_${dt}_${sk}_weights_$w"
        bench "$log" 90 --plugin=$D/libmoe_ep.so --dtype=$dt --warmup=50 \
          --routing_skew=$sk --dispatch_weights=$w --json="$OUT/$log.json"
        grep -E "^$dt .*\| .*\| " "$OUT/$log.log" | head -10 | cut -c1-116 \
          | sed "s/^/$name skew $sk weights at dispatch $w: /"
      done
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# llcheck: the LL part of quick, for an LL kernel edit measured by ab in
# the same call: the kernel-level test (also on one SM), the LL world
# tests, and the API runs of both combine modes against the oracle (LSA,
# GIN-emulated, graph).
if [ "$MODE" = llcheck ]; then
  timeout $((120 * S)) $B/ll_gpu_test > "$OUT/ll_gpu_test.log" 2>&1
  summary ll_gpu_test $? "$(gtest_key "$OUT/ll_gpu_test.log")"
  ll_gpu_one_sm
  ll_world
  ll_api_core
  api ${E}_graph $N $((40 * S)) --scenario=graph --experts=64 --max_tokens=32 --layers=2048:8 --seeds=100
  api ${E}_lsa_bf16_h2880 $N $((50 * S)) --dtype=bf16 --experts=64 --max_tokens=128 \
    --layers=2880:9,1032:4 --seeds=2
  cat "$OUT/summary.txt"
  exit 0
fi
# llscen: the LL scenarios of rest for such an edit: hooks on two threads
# with mixed weights, a combine hook on a second stream, one buffer set, a
# skipped rank's timeout, and the sanitizers.
if [ "$MODE" = llscen ]; then
  ll_scenarios
  ll_sanitizers
  cat "$OUT/summary.txt"
  exit 0
fi
# misc: rest_misc alone (with llscen and ht, the whole of rest in three
# shorter calls).
if [ "$MODE" = misc ]; then
  rest_misc
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = hold ]; then
  held_stream_creates
  cat "$OUT/summary.txt"
  exit 0
fi
# check: the correctness steps a runtime change needs on one GPU (a few
# minutes): set_reuse's tests (caller context, graph destroy), quick's
# public-API runs, the HT bad-input and skipped-combine runs, and HT rows
# with per-token scales over both transports.
if [ "$MODE" = check ]; then
  set_reuse
  quick_api
  api ht_${E}_bad $N $((60 * S)) --scenario=htbad --mode=ht --experts=8 --max_tokens=16 --layers=256:2
  api ht_${E}_skip_timeout $N $((20 * S)) --scenario=skip --mode=ht --experts=8 --max_tokens=8 \
    --layers=128:2 --kernel_ms=2000
  ht_per_token
  ht_per_token_ginemu
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = api ]; then  # quick's public-API half alone
  quick_api
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = world ]; then  # the one-GPU world tests alone
  world_tests
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = ht ]; then
  ht_suite
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = htnet ]; then
  ht_net_suite
  cat "$OUT/summary.txt"
  exit 0
fi
if [ "$MODE" = one ]; then
  prepare_layout
  set_reuse
  world_tests
  MOE_EP_TEST_WORLD=1 timeout 90 $B/ll_gpu_test > "$OUT/ll_gpu_test_world1.log" 2>&1
  summary ll_gpu_test_world1 $? "$(gtest_key "$OUT/ll_gpu_test_world1.log")"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/ll_gpu_test_world1.log" | head -12
  MOE_EP_TEST_WORLD=1 timeout 60 $B/ll_kernel_bench latency > "$OUT/ll_kernel_bench_world1.log" 2>&1
  summary ll_kernel_bench_world1 $? "$(grep -c "^BENCH" "$OUT/ll_kernel_bench_world1.log") BENCH lines"
  grep -E "^BENCH" "$OUT/ll_kernel_bench_world1.log" | head -4
  api ep1_bf16 1 20 --experts=8 --max_tokens=64 --layers=2048:2 --seeds=1
  api ep1_fp8_dispatch_weights 1 40 --experts=256 --max_tokens=128 --dtype=fp8 \
    --layers=7168:8,2048:1 --seeds=2 --dispatch_weights=1
  api ep1_graph_dispatch_weights 1 40 --scenario=graph --experts=64 --max_tokens=32 \
    --layers=2048:8 --seeds=100 --dispatch_weights=1
  api ep1_bf16_h2880_dispatch_weights 1 40 --dtype=bf16 --experts=64 --max_tokens=64 \
    --layers=2880:9,1032:4 --seeds=2 --dispatch_weights=1
  # The staged layout (transport auto above is LSA: a window without staging)
  api ep1_ginemu_fp8_dispatch_weights 1 40 --transport=gin_emulated --experts=64 \
    --max_tokens=64 --dtype=fp8 --layers=7168:8,2048:1 --seeds=2 --dispatch_weights=1
  api ep1_ginemu_bf16 1 40 --transport=gin_emulated --experts=64 --max_tokens=64 \
    --layers=7168:8,2880:4 --seeds=1
  # HT at EP1, both transports
  api ht_ep1 1 60 --mode=ht --experts=16 --max_tokens=256 --layers=7168:8,2880:4 --seeds=1
  api ht_ep1_fp8_packed 1 60 --mode=ht --dtype=fp8 --scale=ue8m0_packed --experts=256 \
    --max_tokens=512 --layers=7168:8,4096:32 --seeds=1
  api ht_ep1_ginemu 1 60 --mode=ht --transport=gin_emulated --experts=16 --max_tokens=256 \
    --layers=7168:8 --seeds=1
  for tool in memcheck racecheck; do
    for w in 0 1; do
      sanitize "${tool}_dispatch_weights_$w" $tool 1 85 $B/conformance_worker \
        --plugin=$B/libmoe_ep.so --backend=nccl --experts=8 --max_tokens=4 --layers=256:2 \
        --seeds=1 --hooks=0 --dispatch_weights=$w
    done
  done
  # A/B, same machine, alternating so drift hits both: this bundle's
  # library and the previous one's, EP1, fp8, 1 and 128 tokens.
  for round in 1 2; do
    for lib in cur prev; do
      L=$B/libmoe_ep.so; [ $lib = prev ] && L=$B/prev/libmoe_ep.so
      [ -f "$L" ] || continue
      BENCH_RANKS=1 bench "bench1_${lib}_$round" 90 --plugin=$L --dtype=fp8 --tokens=1,128 \
        --warmup=50
      grep -A4 "^latency" "$OUT/bench1_${lib}_$round.log" | grep -E "^fp8" | sed "s/^/$lib $round: /"
    done
  done
  cat "$OUT/summary.txt"
  exit 0
fi
# full = quick, then rest: rest runs the steps after quick's, so the
# whole suite also runs as two shorter runs.
if [ "$MODE" != rest ]; then
timeout $((120 * S)) $B/ll_gpu_test > "$OUT/ll_gpu_test.log" 2>&1
summary ll_gpu_test $? "$(gtest_key "$OUT/ll_gpu_test.log")"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/ll_gpu_test.log" | head -20
timeout $((90 * S)) $B/ll_kernel_bench > "$OUT/ll_kernel_bench.log" 2>&1
summary ll_kernel_bench $? "$(grep -c "^BENCH" "$OUT/ll_kernel_bench.log") BENCH lines"
grep -E "^BENCH|^PHASES rank 0 tokens (1|128) fused" "$OUT/ll_kernel_bench.log" | head -12
# A small grid: every block takes many local experts (and its share of the
# slot lists in several rounds), every send warp many units.
MOE_EP_TEST_SMS=6 timeout $((120 * S)) $B/ll_gpu_test > "$OUT/ll_gpu_test_sms6.log" 2>&1
summary ll_gpu_test_sms6 $? "$(gtest_key "$OUT/ll_gpu_test_sms6.log")"
ll_gpu_one_sm
prepare_layout   # one GPU is enough; the API runs below check prepare too
set_reuse
world_tests
quick_api
bench bench 90 --plugin=$B/libmoe_ep.so --warmup=50 --json="$OUT/bench.json"
grep -A22 "^latency" "$OUT/bench.log"
# The same with the weights at combine only (one row back per (token, expert)).
bench bench_slots 90 --plugin=$B/libmoe_ep.so --warmup=50 --dispatch_weights=false \
  --json="$OUT/bench_slots.json"
grep -A22 "^latency" "$OUT/bench_slots.log" | grep -E "^(fp8|bf16) .* (1|128|256) "
if [ "$MODE" = quick ]; then cat "$OUT/summary.txt"; exit 0; fi
fi
bench bench_graph 150 --plugin=$B/libmoe_ep.so --warmup=50 --graph --json="$OUT/bench_graph.json"
grep -A24 "^latency" "$OUT/bench_graph.log"
# The engine-provided communicator path: the groups adopt the bench's own
# ncclComm (recv_count checked against the routing after every warm-up),
# and the bench keeps using that communicator after each group is gone.
bench bench_adopt 90 --plugin=$B/libmoe_ep.so --adopt_comm --tokens=8,128 --iters=50 --warmup=5
grep -E "adopt|^fp8 .* 128 |^bf16 .* 128 " "$OUT/bench_adopt.log" | head -5
ht_suite
api ${E}_graph $N $((40 * S)) --scenario=graph --experts=64 --max_tokens=32 --layers=2048:8 --seeds=100
api ${E}_routing $N $((30 * S)) --scenario=routing --experts=64 --max_tokens=16 --layers=1024:4
# A bf16 group whose dispatches name their own fp8 format (params->format).
api ${E}_per_call_fp8 $N $((40 * S)) --per_call_format=1 --experts=64 --max_tokens=32 --dtype=fp8 \
  --scale=ue8m0_packed --layers=7168:8,2048:2 --seeds=1 --dispatch_weights=1
api ${E}_ginemu_per_call_fp8 $N $((40 * S)) --transport=gin_emulated --per_call_format=1 --experts=64 \
  --max_tokens=32 --dtype=fp8 --layers=4096:8 --seeds=1
ll_scenarios
rest_misc
ll_sanitizers
cat "$OUT/summary.txt"
