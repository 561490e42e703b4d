#!/bin/bash
# setup.sh: installs the Debian packages moe-ep builds with, when missing.
# The Python front end's tests use Debian's python3 with torch (CPU), pytest
# and numpy. Idempotent and quiet; needs root (or sudo). CUDA 13 + NCCL come
# with the machine image under /usr/local/cuda (see README.md).
set -euo pipefail
PACKAGES=(bazel-bootstrap bazel-platforms libucx-dev ucx-utils libabsl-dev
          libgtest-dev libgmock-dev libyaml-dev libdlpack-dev clang
          libclang-rt-14-dev binutils
          python3-torch python3-pytest python3-numpy)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] || [ ! -f /usr/local/cuda/include/nccl_device.h ]; then
  echo "setup: /usr/local/cuda (CUDA 13 with NCCL 2.28.9 headers) is missing;" \
       "it is part of the build machine image, not a Debian package" >&2
  exit 1
fi
