"""Starts one real process per rank running a worker script, with the
launcher's environment (MOE_EP_RANK, MOE_EP_WORLD_SIZE) and fresh loopback
ports, and waits for all of them within a deadline."""
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)                 # integration/python
REPO = os.path.dirname(os.path.dirname(PY_ROOT))


def _ephemeral_low():
    """The lowest port the kernel hands out to connections on its own."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port, socks):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return False
    socks.append(s)
    return True


def free_ports(n):
    """n distinct loopback ports free now (one per group: a destroyed
    group's port may stay in TIME_WAIT), each with the port after it free
    too and taken by no other (a Buffer's second group listens on the
    next port). They come from below the kernel's ephemeral range, so the
    local end of a connection another group opens later cannot take one;
    a port bind(0) reported free could be, between this check and the
    listen. (10000-19999 belong to the C conformance test, which picks its
    ports a minute ahead of use.)"""
    rng = random.SystemRandom()
    top = _ephemeral_low() - 2
    socks, ports = [], []
    try:
        for _ in range(4000):
            if len(ports) == n or top - 20000 < 100:
                break
            p = rng.randrange(20000, top)
            if any(abs(p - q) <= 1 for q in ports):
                continue
            held = []
            if _bindable(p, held) and _bindable(p + 1, held):
                ports.append(p)
            socks.extend(held)
        while len(ports) < n:  # no room below the ephemeral range
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def library_path():
    return os.environ.get("MOE_EP_LIBRARY") or os.path.join(REPO, "bazel-bin", "plugin",
                                                            "libmoe_ep.so")


def run_ranks(world, worker, args=(), ports=4, timeout=120, extra_path=(),
              token="moe-ep-test-job-token"):
    """Runs workers/<worker> on `world` ranks with `token` as their job
    token (None: MOE_EP_JOB_TOKEN unset); returns (ok, report) where
    report holds every rank's exit code and output."""
    port_list = ",".join(str(p) for p in free_ports(ports))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(list(extra_path) + [PY_ROOT, HERE])
    env["MOE_EP_LIBRARY"] = library_path()
    env["MOE_EP_TEST_PORTS"] = port_list
    env["MOE_EP_WORLD_SIZE"] = str(world)
    env.pop("MOE_EP_BOOTSTRAP_ADDRESS", None)
    env.pop("MOE_EP_JOB_TOKEN", None)
    if token is not None:
        env["MOE_EP_JOB_TOKEN"] = token
    script = os.path.join(HERE, "workers", worker)
    # Each rank writes to a file of its own, not a pipe: a rank whose output
    # outgrew a pipe would block in its write while this process waits for
    # another rank, and its peers would then wait for it until the deadline.
    procs, logs, killed = [], [], set()
    try:
        for r in range(world):
            env_r = dict(env, MOE_EP_RANK=str(r))
            logs.append(tempfile.TemporaryFile())
            procs.append(subprocess.Popen([sys.executable, script] + [str(a) for a in args],
                                          env=env_r, stdout=logs[r],
                                          stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for r, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed.add(r)
        outputs = []
        for r, log in enumerate(logs):
            log.seek(0)
            out = log.read().decode(errors="replace")
            if r in killed:
                out += "\n[rank %d killed after the %d s deadline]" % (r, timeout)
            outputs.append(out)
    finally:
        for proc in procs:  # none outlives a failure here (an exception, ^C)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    codes = [p.returncode for p in procs]
    report = "\n".join("---- rank %d exit %s ----\n%s" % (r, codes[r], outputs[r])
                       for r in range(world))
    return all(c == 0 for c in codes), report
