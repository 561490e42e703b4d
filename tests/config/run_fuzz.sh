#!/usr/bin/env bash
# run_fuzz.sh [SECONDS]: builds tests/config/config_fuzz.cc with libFuzzer +
# ASan (clang 14, sources compiled directly) and runs it on the seed corpus.
# Exits non-zero on any crash, leak or timeout.
#
# By default the run is the same every time: libFuzzer's seed 1 and a fixed
# number of inputs (FUZZ_RUNS, default 300000: about 20 s on an idle core),
# so a test run fails for a change in the code, never for an input a fresh
# random seed happened to reach. FUZZ_OPEN=1 fuzzes open-ended instead: a
# seed of libFuzzer's choosing, for SECONDS (default 30), e.g.
#   FUZZ_OPEN=1 tests/config/run_fuzz.sh 600
# (or bazel test --test_env=FUZZ_OPEN=1 //tests/config:config_fuzz_test).
set -euo pipefail

secs="${1:-30}"
runs="${FUZZ_RUNS:-300000}"
if [[ "${FUZZ_OPEN:-0}" == 1 ]]; then
  bound=(-seed=0 -max_total_time="$secs")  # seed 0: libFuzzer draws one
  plan="${secs}s, a random seed"
else
  bound=(-seed=1 -runs="$runs")
  plan="$runs inputs from seed 1"
fi
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  root="${TEST_SRCDIR}/${TEST_WORKSPACE:-moe_ep}"  # inside bazel test
else
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fi
work="${TEST_TMPDIR:-$(mktemp -d /tmp/config_fuzz.XXXXXX)}"
cc="${FUZZ_CC:-clang}"
cxx="${FUZZ_CXX:-clang++}"
flags=(-g -O1 -fno-omit-frame-pointer -I"$root" -I"$root/plugin/include")

mkdir -p "$work/obj" "$work/corpus"
objs=()
for src in "$root"/runtime/config*.c "$root/runtime/error.c" \
           "$root/runtime/log.c"; do
  obj="$work/obj/$(basename "$src" .c).o"
  "$cc" -std=c11 "${flags[@]}" -fsanitize=fuzzer-no-link,address \
    -c "$src" -o "$obj"
  objs+=("$obj")
done
"$cxx" -std=c++17 "${flags[@]}" -fsanitize=fuzzer,address \
  "$root/tests/config/config_fuzz.cc" "${objs[@]}" -l:libyaml.a -lpthread \
  -o "$work/config_fuzz"

# libFuzzer adds what it finds to the first corpus folder: keep the seeds in
# the tree untouched and grow a copy.
cp "$root"/tests/config/fuzz_corpus/* "$work/corpus/"
echo "run_fuzz: $plan, on $(ls "$work/corpus" | wc -l) seed inputs in $work"
# Keep the fuzzer away from engine overrides set in this shell.
for v in $(env | sed -n 's/^\(MOE_EP_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
status=0
"$work/config_fuzz" "${bound[@]}" -detect_leaks=1 -timeout=10 \
  -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" >"$work/fuzz.log" 2>&1 || status=$?
grep -E '^(stat::|Done |#[0-9]+.*DONE)' "$work/fuzz.log" || true
if [[ $status -ne 0 ]]; then
  tail -n 60 "$work/fuzz.log"
  echo "run_fuzz: FAILED (fuzzer exit $status); artifacts in $work" >&2
  exit 1
fi
echo "run_fuzz: OK"
