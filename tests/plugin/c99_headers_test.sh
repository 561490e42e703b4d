#!/bin/bash
# The C99 compile happened at build time (genrule); this records it ran.
ls "$TEST_SRCDIR"/moe_ep/tests/plugin/c99_headers.o >/dev/null && echo PASS
