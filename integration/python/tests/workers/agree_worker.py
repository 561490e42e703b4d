"""The Buffer's rounds over a real torch.distributed group (gloo): gather
and max give every rank the same answers, and a round that a peer skips
raises moe_ep.TimeoutError naming this rank once the channel's bound has
passed, instead of waiting for torch's watchdog. argv[1]: a folder the
ranks share for their out-of-band order."""
import os
import sys
import time

import torch.distributed as dist

import common
import moe_ep
from common import RANK, WORLD, fail, expect_raises
from moe_ep.deep_ep import _agree as agree

SKIPPED = os.path.join(sys.argv[1], "rank0_gave_up")


def rounds_every_rank_makes(group):
    ch = agree.Channel(group, None, timeout_s=120)
    mine = {"rank": RANK, "text": "r" * (17 * RANK), "none": None}
    everyone = ch.gather(mine)
    want = [{"rank": r, "text": "r" * (17 * r), "none": None} for r in range(WORLD)]
    if everyone != want:
        fail("gather", "-", "got %r want %r" % (everyone, want))
    nones = ch.gather(None)
    if nones != [None] * WORLD:
        fail("gather of None", "-", "got %r" % (nones,))
    got = ch.max(10 * RANK + 3)
    if got != 10 * (WORLD - 1) + 3:
        fail("max", "-", "got %d want %d" % (got, 10 * (WORLD - 1) + 3))


def round_a_peer_skips(group):
    """Rank 0 starts a round the others make only after it gave up: its
    call raises TimeoutError; then they make it, which completes rank 0's
    abandoned collective, so the group tears down cleanly."""
    if RANK == 0:
        ch = agree.Channel(group, None, timeout_s=2)
        expect_raises("a round the peers skip", moe_ep.TimeoutError,
                      "rank 0: Buffer: agreeing on the largest batch over the engine's process "
                      "group did not complete within 2 s", lambda: ch.max(1))
        with open(SKIPPED, "w") as f:
            f.write("done\n")
        return
    deadline = time.monotonic() + 120
    while not os.path.exists(SKIPPED) and time.monotonic() < deadline:
        time.sleep(0.01)
    if not os.path.exists(SKIPPED):
        fail("a round the peers skip", "-", "rank 0 did not give up within 120 s")
    agree.Channel(group, None, timeout_s=120).max(0)


def main():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % common.PORTS[0],
                            rank=RANK, world_size=WORLD)
    group = dist.new_group(list(range(WORLD)))
    rounds_every_rank_makes(group)
    round_a_peer_skips(group)
    dist.barrier(group=group)
    dist.destroy_process_group()
    common.finish()


if __name__ == "__main__":
    main()
