"""cuda_library: compiles .cu files with nvcc (sm_90 SASS + compute_90 PTX).

Bazel 4.2.3 has no CUDA rules and nothing may be downloaded, so each .cu
becomes one genrule calling the toolkit's nvcc; the objects then link like any
other cc_library source. `hdrs_in` lists every header the .cu files include
(genrules do not see a cc_library's transitive headers).
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-lineinfo",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
    "-Xcompiler -fPIC,-Wall,-Werror,-fvisibility=hidden",
    "--Werror all-warnings",
    "-I.",
]

def cuda_library(name, srcs, hdrs = [], hdrs_in = [], deps = [], nvcc_flags = [], **kwargs):
    objs = []
    for src in srcs:
        stem = src.replace("/", "_").rsplit(".", 1)[0]
        obj = "_%s_%s.o" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + hdrs_in,
            outs = [obj],
            # Own temp dir: sandboxed actions all run as PID 2, so parallel
            # nvcc runs would otherwise collide on /tmp/tmpxft_00000002_*.
            cmd = "T=$$(mktemp -d) && TMPDIR=$$T %s %s %s -c $(location %s) -o $@; r=$$?; rm -rf $$T; exit $$r" % (
                NVCC,
                " ".join(NVCC_FLAGS),
                " ".join(nvcc_flags),
                src,
            ),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        linkstatic = 1,
        **kwargs
    )
