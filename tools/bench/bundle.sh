#!/usr/bin/env bash
# bundle.sh: builds the benchmark, the plugin and the launcher here (no GPU
# needed) and copies them into .gpu_bundle/ (bazel-bin is a symlink and does
# not travel), with run_bench.sh to start it on the GPU machine. Usage:
#   tools/bench/bundle.sh
# then a device run with kind nvidia-h200-x2 and carry [".gpu_bundle"]:
#   bash .gpu_bundle/run_bench.sh 2 [moe_ep_bench flags...]
# (1 instead of 2 on a one-GPU machine). Set MEP_BAZEL_OUTPUT_BASE to build
# with another output base.
set -euo pipefail
cd "$(dirname "$0")/../.."
BZ=(bazel)
[ -n "${MEP_BAZEL_OUTPUT_BASE:-}" ] && BZ+=(--output_base="$MEP_BAZEL_OUTPUT_BASE")
"${BZ[@]}" build //plugin:libmoe_ep.so //tools/launcher:moe_ep_run //tools/bench:moe_ep_bench
BIN="$("${BZ[@]}" info bazel-bin 2>/dev/null)"
mkdir -p .gpu_bundle
for f in plugin/libmoe_ep.so tools/launcher/moe_ep_run tools/bench/moe_ep_bench; do
  rm -f ".gpu_bundle/$(basename "$f")"
  cp -L "$BIN/$f" .gpu_bundle/
done
cat > .gpu_bundle/run_bench.sh <<'INNER'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: run_bench.sh RANKS [flags].
# Output goes to stdout and $OUT/bench.log; JSON to $OUT/bench.json.
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/mep_out}
mkdir -p "$OUT"
N=${1:-2}; shift || true
B=.gpu_bundle
timeout 560 $B/moe_ep_run -n "$N" --timeout_s 550 -- $B/moe_ep_bench \
  --plugin=$B/libmoe_ep.so --json="$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
echo "moe_ep_bench exit code $rc"
exit $rc
INNER
chmod +x .gpu_bundle/run_bench.sh
echo "bundle ready in .gpu_bundle/ ($(du -sh .gpu_bundle | cut -f1))"
echo 'device run: kind=nvidia-h200-x2 carry=[".gpu_bundle"] command="bash .gpu_bundle/run_bench.sh 2"'
