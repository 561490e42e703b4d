#!/usr/bin/env bash
# ab_variant.sh: builds one variant for run_device.sh's ab, skew, sass and
# htab modes into .gpu_bundle/ab/<name>/ (libmoe_ep.so and ll_kernel_bench),
# from the working tree with a patch applied for the build only, or as it
# stands, then packs .gpu_bundle.txz again. Run tools/device_suite.sh first:
# it builds the bundle the variants are compared against (and empties ab/).
#
#   tools/ab_variant.sh NAME PATCH   # git apply PATCH, build, git apply -R
#   tools/ab_variant.sh NAME         # the working tree as it is
#
# A patch is made with `git diff > /tmp/x.patch` after editing (then `git
# checkout` the edit), so the tree stays the bundle's. A failed build copies
# nothing and leaves the tree as it was.
set -euo pipefail
usage() { echo "usage: tools/ab_variant.sh NAME [PATCH]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
name=$1 patch=${2:-}
# run_device.sh splits its variant list on spaces and calls the bundle cur
if ! [[ "$name" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || [ "$name" = cur ]; then
  echo "ab_variant: NAME '$name' must be letters, digits, '_', '.', '-' (not cur)" >&2
  exit 2
fi
if [ -n "$patch" ]; then
  [ -f "$patch" ] || { echo "ab_variant: PATCH '$patch' is not a file" >&2; exit 2; }
  patch=$(realpath "$patch")  # before the cd below
fi
cd "$(dirname "$0")/.."
[ -f .gpu_bundle/libmoe_ep.so ] || {
  echo "ab_variant: no .gpu_bundle/libmoe_ep.so: run tools/device_suite.sh first" >&2; exit 2; }
if [ -n "$patch" ]; then
  git apply --check "$patch"
  git apply "$patch"
  # the tree goes back whether the build passes or not
  trap 'git apply -R "$patch"' EXIT
fi
bazel build //plugin:libmoe_ep.so //tools/bench:ll_kernel_bench
out=.gpu_bundle/ab/$name
# staged outside ab/, so that a failed copy leaves no half variant there
stage=$(mktemp -d) && chmod 755 "$stage"
cp -L bazel-bin/plugin/libmoe_ep.so bazel-bin/tools/bench/ll_kernel_bench "$stage/"
rm -rf "$out" && mkdir -p .gpu_bundle/ab && mv "$stage" "$out"
tar cf - .gpu_bundle | xz -T0 -6 > .gpu_bundle.txz
echo "ab_variant: $out ($(du -sh "$out" | cut -f1)); bundle packed: $(du -sh .gpu_bundle.txz | cut -f1)"
