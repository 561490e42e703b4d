#!/usr/bin/env python3
"""phase_deltas_test.py: phase_deltas.py on two hand-written stamps logs
(two builds, one round each, two ranks, rank 1 of the second build with a
late peer), in ll_kernel_bench's layout."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def log(rank_phases):
    """A stamps log: rank -> {phase: (min, median, max)} at 128 tokens."""
    out = []
    for rank, phases in rank_phases.items():
        out.append(f"PHASES rank {rank} tokens 128 fused fp8 dispatch: event median 17.0 us; "
                   "per phase, us after the first block's entry")
        for name, (lo, med, hi) in phases.items():
            out.append(f"PHASES rank {rank} tokens 128 {name:<10} {lo:6.2f} {med:6.2f} {hi:6.2f}")
        out.append(f"PHASES rank {rank} tokens 128 slowest sent: block 3 2.80 block 4 2.70")
    return "\n".join(out) + "\n"


def phases(entry, sent, heads, joined, seen, copied, copied_max, done, done_max):
    return {"entry": (0.0, entry, 0.2), "sent": (1.0, sent, 3.0), "heads": (2.0, heads, 4.0),
            "joined": (4.0, joined, 6.0), "seen": (5.0, seen, 7.0),
            "copied": (6.0, copied, copied_max), "done": (7.0, done, done_max),
            "word waits": (1.0, 3.0, 7.0)}


def main():
    d = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    a = os.path.join(d, "stamps_cur_1.log")
    b = os.path.join(d, "stamps_my_build_1.log")
    with open(a, "w") as f:
        f.write(log({0: phases(0.1, 2.8, 3.7, 5.0, 5.6, 8.2, 9.4, 8.5, 9.9),
                     1: phases(0.1, 2.7, 3.6, 5.2, 5.8, 8.5, 9.6, 8.8, 10.1)}))
    with open(b, "w") as f:
        # rank 1 waited 20 us for its peer: left out
        f.write(log({0: phases(0.1, 2.8, 3.7, 5.0, 5.6, 7.6, 9.0, 7.9, 9.3),
                     1: phases(0.1, 2.8, 17.0, 25.0, 25.6, 27.6, 29.0, 27.9, 29.3)}))
    out = subprocess.run([sys.executable, os.path.join(HERE, "phase_deltas.py"), a, b],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    want = ["cur               128  2/2   2.60-2.70    1.30-1.60    0.60         2.60-2.70"
            "    3.80         0.30         9.90-10.10 ",
            "my_build          128  1/2   2.70         1.30         0.60         2.00     "
            "    3.40         0.30         9.30       "]
    if out[1:] != want or not out[0].startswith("build"):
        print("phase_deltas_test: expected\n  " + "\n  ".join(want) + "\ngot\n  " +
              "\n  ".join(out))
        return 1
    bad = subprocess.run([sys.executable, os.path.join(HERE, "phase_deltas.py"),
                          os.path.join(d, "other.log")], capture_output=True, text=True)
    if bad.returncode == 0 or "not named stamps_" not in bad.stdout + bad.stderr:
        print("phase_deltas_test: a log without the stamps_<build>_<round> name was taken")
        return 1
    print("phase_deltas_test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
