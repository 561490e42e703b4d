#!/bin/bash
# setup.sh: installs the Debian packages moe-ep builds with, when missing.
# Bazel's C/C++ toolchain is the system gcc / g++; the fuzz test compiles
# with clang. The Python front end's tests use Debian's python3 with torch
# (CPU), pytest and numpy, and build its wheel with pip and setuptools.
# Idempotent and quiet; needs root (or sudo). CUDA 13 + NCCL come with the
# machine image under /usr/local/cuda (see README.md): checked, not
# installed.
set -euo pipefail
PACKAGES=(bazel-bootstrap bazel-platforms build-essential libucx-dev ucx-utils
          libabsl-dev libgtest-dev libgmock-dev libyaml-dev libdlpack-dev clang
          libclang-rt-14-dev binutils
          python3-torch python3-pytest python3-numpy python3-pip
          python3-setuptools)
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
# What the Bazel build takes from the toolkit (tools/bazel/cuda.bzl and
# tools/bazel/system/cuda.BUILD): nvcc, the CUDA and NCCL headers, the
# static CUDA runtime and NCCL's library.
CUDA=/usr/local/cuda
cuda_missing=()
[ -x "$CUDA/bin/nvcc" ] || cuda_missing+=("$CUDA/bin/nvcc")
for f in include/cuda_runtime_api.h include/nccl.h include/nccl_device.h \
         lib/libcudart_static.a lib/libnccl.so; do
  [ -e "$CUDA/$f" ] || cuda_missing+=("$CUDA/$f")
done
if [ ${#cuda_missing[@]} -gt 0 ]; then
  echo "setup: the CUDA toolkit the build needs is incomplete; missing:" >&2
  printf '  %s\n' "${cuda_missing[@]}" >&2
  echo "setup: $CUDA (CUDA 13 with NCCL 2.28.9, libraries in $CUDA/lib) is part" \
       "of the build machine image, not a Debian package" >&2
  exit 1
fi
