"""The example decode loop (examples/decode_loop.py), started by the
launcher as its docstring says, a few steps: every step of both adapters
checks itself against its reference and the table shows it."""
import os
import subprocess
import sys

from spawn import PY_ROOT, REPO, library_path

LAUNCHER = os.path.join(REPO, "bazel-bin", "tools", "launcher", "moe_ep_run")


def test_decode_loop_three_steps():
    assert os.access(LAUNCHER, os.X_OK), "build //tools/launcher:moe_ep_run first (%s)" % LAUNCHER
    env = dict(os.environ, MOE_EP_LIBRARY=library_path())
    env.pop("MOE_EP_BOOTSTRAP_ADDRESS", None)  # the launcher picks a free port
    r = subprocess.run([LAUNCHER, "-n", "2", "--timeout_s", "120", "--", sys.executable,
                        os.path.join(PY_ROOT, "examples", "decode_loop.py"), "--steps", "3"],
                       env=env, capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for line in ("rank 0: ok (3 steps)", "rank 1: ok (3 steps)"):
        assert line in out, out
    rows = [l.split() for l in out.splitlines()
            if len(l.split()) > 2 and l.split()[1] in ("vllm", "sglang")]
    assert sorted((int(r[0]), r[1]) for r in rows) == \
        sorted((s, a) for s in range(3) for a in ("vllm", "sglang")), out
    assert all(r[-1] == "ok" for r in rows), out
