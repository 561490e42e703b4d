#!/bin/bash
# exports_test.sh: the built libmoe_ep.so defines no dynamic symbol but the
# versioned tables moe_ep_plugin_v*.
set -euo pipefail
lib="$1"
defined=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//')
echo "defined dynamic symbols: $defined"
[ -n "$defined" ] || { echo "FAIL: no symbols exported"; exit 1; }
bad=$(echo "$defined" | grep -v '^moe_ep_plugin_v[0-9]*$' || true)
if [ -n "$bad" ]; then echo "FAIL: unexpected exports: $bad"; exit 1; fi
echo "$defined" | grep -qx moe_ep_plugin_v1 || { echo "FAIL: moe_ep_plugin_v1 missing"; exit 1; }
echo PASS
