#!/bin/bash
# test.sh: the README's test command: set up, build everything (CUDA kernels
# for sm_90 included), run every CPU suite (GPU suites are tagged "gpu" and
# skipped; see tools/device_suite.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //...
bazel test //... --test_output=errors --local_test_jobs=2
# The Python front end (integration/python) against the library just built,
# with Debian's python3 (the one with torch). pytest's exit code 5 means it
# collected no tests: a broken test tree, so it fails here too.
python_rc=0
MOE_EP_LIBRARY="$PWD/bazel-bin/plugin/libmoe_ep.so" /usr/bin/python3 -m pytest -q \
  -p no:cacheprovider integration/python/tests || python_rc=$?
if [ "$python_rc" -ne 0 ]; then
  [ "$python_rc" -eq 5 ] && echo "test.sh: pytest collected no Python tests" >&2
  exit "$python_rc"
fi
# The same CPU suites again under AddressSanitizer + LeakSanitizer (the fuzz
# target builds its own ASan binary, so it is not repeated here).
bazel test --config=asan //... --test_tag_filters=-gpu,-fuzz --test_output=errors \
  --local_test_jobs=2
# ThreadSanitizer over the host backend and the runtime: hooks run and
# handles freed on other threads, the logger's callbacks. UCX's memory hooks
# (libucm) call into TSan while a thread is torn down and crash it, so the
# TSan pass runs with them off (UCX_MEM_EVENTS=no). The 8-rank conformance
# cases are left to the plain and ASan passes: eight instrumented processes
# on two cores add minutes and no thread a 2- or 4-rank case lacks.
bazel test --config=tsan --test_env=UCX_MEM_EVENTS=no //tests/host/... //tests/runtime/... \
  --test_tag_filters=-gpu,-fuzz --test_output=errors --local_test_jobs=2 \
  --test_arg=--gtest_filter=-*_r8*
