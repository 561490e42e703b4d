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
