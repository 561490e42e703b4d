"""Compiler flags for the project's own code: warnings are errors."""

MEP_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    # Messages are truncated on purpose to fixed buffers.
    "-Wno-format-truncation",
    "-fvisibility=hidden",
]

MEP_CONLYOPTS = MEP_COPTS + ["-Wstrict-prototypes", "-Wmissing-prototypes"]

# Tests and tools: same warnings, default visibility (Bazel links test
# libraries as shared objects).
MEP_TEST_COPTS = [c for c in MEP_COPTS if c != "-fvisibility=hidden"]
