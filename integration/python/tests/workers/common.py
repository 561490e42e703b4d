"""What every worker shares: its rank, its ports, a config per group, and
failure reports that carry rank, seed, first bad index, expected and got."""
import faulthandler
import os
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist

# A rank that dies of a signal (SIGSEGV in native code) prints every
# thread's Python stack into its report first.
faulthandler.enable()

RANK = int(os.environ["MOE_EP_RANK"])
WORLD = int(os.environ["MOE_EP_WORLD_SIZE"])
PORTS = [int(p) for p in os.environ["MOE_EP_TEST_PORTS"].split(",")]
failures = []


def config(port_index, **keys):
    """A host-backend moe_ep: section on the port_index-th test port."""
    c = {"backend": "host", "bootstrap": {"address": "127.0.0.1:%d" % PORTS[port_index],
                                          "timeout_ms": 60000},
         "timeouts": {"kernel_ms": 60000}}
    c.update(keys)
    return c


def fail(what, seed, text):
    failures.append("rank %d seed %s %s: %s" % (RANK, seed, what, text))
    print(failures[-1], flush=True)


def same(what, seed, got, want):
    """Bit-exact comparison of two arrays (compared as their bytes)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        fail(what, seed, "shape got %s want %s" % (got.shape, want.shape))
        return False
    if got.size == 0:
        return True
    g = got.reshape(-1).view(np.uint8 if got.dtype.itemsize == 1 else
                             {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize])
    w = want.reshape(-1).view(g.dtype)
    bad = np.nonzero(g != w)[0]
    if len(bad):
        i = bad[0]
        fail(what, seed, "%d of %d differ; first at flat index %d (%s): got %s want %s"
             % (len(bad), g.size, i, np.unravel_index(i, got.shape), got.reshape(-1)[i],
                want.reshape(-1)[i]))
        return False
    return True


def within_ulp(what, seed, got, want, ulps):
    """bf16 bit patterns equal up to `ulps` units in the last place."""
    def ordinal(b):
        b = np.asarray(b, dtype=np.int32)
        return np.where(b & 0x8000, -(b & 0x7FFF), b)
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        fail(what, seed, "shape got %s want %s" % (got.shape, want.shape))
        return False
    bad = np.nonzero(np.abs(ordinal(got) - ordinal(want)).reshape(-1) > ulps)[0]
    if len(bad):
        i = bad[0]
        fail(what, seed, "%d of %d differ by more than %d ulp; first at flat index %d (%s): "
             "got 0x%04x want 0x%04x" % (len(bad), got.size, ulps, i,
                                         np.unravel_index(i, got.shape), got.reshape(-1)[i],
                                         want.reshape(-1)[i]))
        return False
    return True


def bits(t):
    """numpy bit patterns of a torch tensor (bf16 -> uint16, fp8 -> uint8)."""
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.element_size() == 1 and t.dtype not in (torch.uint8, torch.int8, torch.bool):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def bf16_tensor(bits_u16):
    return torch.from_numpy(np.ascontiguousarray(bits_u16).view(np.int16)).view(torch.bfloat16)


def expect_raises(what, exc_type, fragment, fn):
    """fn() must raise exc_type with `fragment` in the message."""
    try:
        fn()
    except exc_type as e:
        if fragment not in str(e):
            fail(what, "-", "message %r lacks %r" % (str(e), fragment))
        return e
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        fail(what, "-", "raised %s(%r), want %s" % (type(e).__name__, str(e), exc_type.__name__))
        return None
    fail(what, "-", "did not raise %s" % exc_type.__name__)
    return None


def run_on_thread(hook, seed="-"):
    """Runs hook() on a second thread (as an engine's other micro-batch
    does) and returns its result; a failure or a thread still running
    after 120 s is reported."""
    box = {}

    def run():
        try:
            box["r"] = hook()
        except Exception as e:  # noqa: BLE001 - reported
            box["e"] = repr(e)
    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    if "e" in box or t.is_alive():
        fail("hook thread", seed, box.get("e", "still running after 120 s"))
    return box.get("r")


class GlooComm:
    """What DeepEP reads of an mpi4py communicator (comm=), over a gloo group."""

    def __init__(self, group):
        self.group = group

    def Get_rank(self):
        return dist.get_rank(self.group)

    def Get_size(self):
        return dist.get_world_size(self.group)

    def allgather(self, obj):
        out = [None] * self.Get_size()
        dist.all_gather_object(out, obj, group=self.group)
        return out


def finish():
    print("rank %d: %s" % (RANK, "%d failures" % len(failures) if failures else "ok"), flush=True)
    sys.stdout.flush()
    os._exit(1 if failures else 0)
