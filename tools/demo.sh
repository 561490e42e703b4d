#!/bin/bash
# demo.sh: the README's main command: set up, build, and run the example
# engine's decode loop on 4 local ranks (host backend), verifying every step.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //plugin:libmoe_ep.so //integration:moe_ep_demo //tools/launcher:moe_ep_run
bazel-bin/tools/launcher/moe_ep_run -n "${MOE_EP_DEMO_RANKS:-4}" -- \
  bazel-bin/integration/moe_ep_demo --config integration/configs/demo.yaml \
  --plugin bazel-bin/plugin/libmoe_ep.so --steps "${MOE_EP_DEMO_STEPS:-50}" --verify
