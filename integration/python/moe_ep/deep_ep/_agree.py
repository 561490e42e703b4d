"""What a Buffer's ranks agree on over the channel the engine gave it (a
torch.distributed group, or an mpi4py communicator as DeepEP's `comm=`):
rank 0's bootstrap address, the normal-mode token cap, the job token,
whether a worst-case receive overflowed anywhere, and the largest batch of
a normal-mode layer call (whether a derived cap must grow)."""
import hashlib
import ipaddress
import os
import secrets
import socket

# The host rank 0 publishes with the port it picks for a group.
HOST_ENV = "MOE_EP_BOOTSTRAP_HOST"
# The normal-mode group's cap a rank may be given (compared across ranks).
HT_TOKENS_ENV = "MOE_EP_HT_MAX_TOKENS_PER_RANK"
# The library's cap of every group (it wins over the rest for the
# normal-mode group; the Buffer pins the low-latency group's).
TOKENS_ENV = "MOE_EP_MAX_TOKENS_PER_RANK"

# Job tokens the Buffers put into the environment: variable -> token.
_AGREED_TOKENS = {}


def reduce_device(backend):
    """The device a torch group of `backend` (dist.get_backend's or
    get_backend_config's string) all-reduces a tensor on: "cpu" where it has a CPU backend (gloo, mpi,
    ucc, or torch 2's "cpu:gloo,cuda:nccl"), "cuda" for nccl alone, None
    for any other (the caller then gathers objects instead)."""
    name = str(backend).lower()
    if ":" in name:  # torch 2: "device:backend" pairs
        devices = {}
        for pair in name.split(","):
            device, _, b = pair.partition(":")
            devices[device.strip()] = b.strip()
        if "cpu" in devices:
            return "cpu"
        return "cuda" if "cuda" in devices else None
    if name in ("gloo", "mpi", "ucc"):
        return "cpu"
    return "cuda" if name == "nccl" else None


# How long a round over the channel may wait for the other ranks when the
# Buffer gives no bound: the library's default bootstrap.timeout_ms.
DEFAULT_TIMEOUT_S = 30.0
# How often a round in flight is looked at.
_POLL_S = 0.0005


class Channel:
    """rank, size, gather(obj) -> every rank's obj, and max(n) -> the
    largest of the ranks' ints, over a torch group (all_gather and
    all_reduce, or all_gather_object) or an mpi4py communicator
    (allgather). A round over a torch group whose backend runs on the CPU
    or on CUDA waits for the other ranks at most timeout_s, then raises
    moe_ep.TimeoutError naming this rank (a peer that died, or skipped the
    call, would otherwise hold this rank until torch's own watchdog); the
    group is then out of step, and on nccl the collective stays queued on
    its stream: the engine aborts the group. Not bounded: a torch nccl
    group's first collective, which creates its communicator inside the
    call and waits there for every rank (unless the engine initialised it
    eagerly, init_process_group's device_id); a backend of another kind;
    an mpi4py communicator."""

    def __init__(self, group, comm, timeout_s=None):
        self.group, self.comm = group, comm
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        if group is not None:
            self.rank, self.size = group.rank(), group.size()
        else:
            self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def _device(self):
        """The device the torch group's collectives run on (reduce_device),
        None when its backend is of another kind."""
        import torch
        import torch.distributed as dist
        device = reduce_device(dist.get_backend(self.group))
        config = getattr(dist, "get_backend_config", None)  # torch >= 2.1
        if device is None and config is not None:
            # A group made without naming its backend is "undefined" to
            # get_backend; its config maps devices ("cuda:nccl").
            device = reduce_device(config(self.group))
        if device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def _await(self, work, what):
        """Waits for a collective started with async_op=True: at most
        timeout_s, then moe_ep.TimeoutError. Once complete, work.wait()
        orders the current stream after it (a CUDA collective runs on a
        stream of its backend's)."""
        import time
        deadline = time.monotonic() + self.timeout_s
        # Short pauses first (a collective of a few ints ends within tens
        # of microseconds), doubling up to _POLL_S: every normal-mode layer
        # call whose cap the Buffer derived takes one such round.
        pause = 0.0
        while not work.is_completed():
            if time.monotonic() >= deadline:
                from ..errors import TimeoutError as MoeEpTimeoutError
                raise MoeEpTimeoutError(
                    "rank %d: Buffer: %s over the engine's process group did not complete "
                    "within %.0f s (bootstrap.timeout_ms): a rank of the group died or did not "
                    "make the same call; the group is out of step" % (self.rank, what,
                                                                       self.timeout_s))
            time.sleep(pause)
            pause = min(_POLL_S, pause * 2 if pause else 1e-5)
        work.wait()

    def gather(self, obj):
        if self.group is None:
            return list(self.comm.allgather(obj))
        import pickle
        import torch
        import torch.distributed as dist
        device = self._device()
        if device is None:
            everyone = [None] * self.size
            dist.all_gather_object(everyone, obj, group=self.group)
            return everyone
        # Two rounds: the sizes, then the bytes padded to the largest.
        data = pickle.dumps(obj)
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
        sizes = [torch.empty_like(size) for _ in range(self.size)]
        self._await(dist.all_gather(sizes, size, group=self.group, async_op=True),
                    "gathering every rank's answer")
        sizes = [int(n.item()) for n in sizes]
        mine = torch.zeros(max(sizes), dtype=torch.uint8)
        if data:
            mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(device)
        rows = [torch.empty_like(mine) for _ in range(self.size)]
        self._await(dist.all_gather(rows, mine, group=self.group, async_op=True),
                    "gathering every rank's answer")
        return [pickle.loads(bytes(r[:n].cpu().tolist())) for r, n in zip(rows, sizes)]

    def max(self, value):
        """The largest of the ranks' ints `value`. A torch group: one
        all_reduce (op MAX) of a 1-element int64 tensor on the device its
        backend supports (CPU for gloo, the current CUDA device for nccl,
        whose result is read once the current stream has reached it;
        get_backend_config decides where get_backend says "undefined"), else
        a gather; a comm: its allgather."""
        value = int(value)
        if self.group is None:
            return max(int(v) for v in self.comm.allgather(value))
        import torch
        import torch.distributed as dist
        device = self._device()
        if device is None:
            return max(int(v) for v in self.gather(value))
        t = torch.tensor([value], dtype=torch.int64, device=device)
        self._await(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True),
                    "agreeing on the largest batch")
        return int(t.item())


def channel(group, comm, timeout_s=None):
    """The Buffer's Channel, or None when it was given neither."""
    if group is None and comm is None:
        return None
    return Channel(group, comm, timeout_s)


def _ip(host):
    """host as an address, or None for a name (an IPv6 zone, "%eth0", is
    dropped)."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def is_loopback(host):
    ip = _ip(host)
    return ip.is_loopback if ip is not None else host == "localhost"


def address_of(host, port):
    """The bootstrap address "host:port", with an IPv6 literal in brackets
    ("[fd00::1]:port"), which the library's parser needs to tell the
    address's colons from the port's."""
    ip = _ip(host)
    if ip is not None and ip.version == 6 and not host.startswith("["):
        return "[%s]:%d" % (host, port)
    return "%s:%d" % (host, port)


def store_host():
    """The host of torch.distributed's default store when it is a TCPStore
    (or a PrefixStore over one): the address an engine passed as
    init_method tcp://host:port, where vLLM and SGLang export no
    MASTER_ADDR. None otherwise (not initialised, a file or hash store)."""
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            return None
        from torch.distributed import distributed_c10d
        store = distributed_c10d._get_default_store()
    except (ImportError, AttributeError, RuntimeError, ValueError):
        return None
    tcp = getattr(dist, "TCPStore", None)
    for _ in range(8):  # PrefixStores may nest; each one names its underlying store
        if tcp is not None and isinstance(store, tcp):
            return getattr(store, "host", None) or None
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def bootstrap_host():
    """The host rank 0 publishes with the port it picked:
    MOE_EP_BOOTSTRAP_HOST, else this machine's address on its route toward
    MASTER_ADDR or, without it, toward the default store's host (rank 0 of
    an expert-parallel group need not run on that host), else 127.0.0.1
    (one host)."""
    host = os.environ.get(HOST_ENV)
    if host:
        return host
    master = os.environ.get("MASTER_ADDR") or store_host()
    if not master:
        return "127.0.0.1"
    # Connecting a UDP socket sends nothing: it only chooses the route, and
    # with it this end's address, in the family MASTER_ADDR resolves to.
    found = None
    try:
        targets = socket.getaddrinfo(master.strip("[]"), 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        targets = []
    for family, _, _, _, where in targets:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(where)
                found = s.getsockname()[0]
                break
        except OSError:
            continue
    if found is None:
        return master
    # A name that resolves to loopback here (127.0.1.1 for the host's own
    # name on Debian) may resolve to a routable address elsewhere: publish
    # the name, as given, unless it is itself a loopback address.
    if is_loopback(found) and not is_loopback(master):
        return master
    return found


# Below the ephemeral range, ports from here up are left alone: torch's
# rendezvous defaults (29400, 29500), this library's (29500) and
# Kubernetes' NodePorts (30000-32767), which may be forwarded without being
# bound, so a bind check cannot see them.
_LOW_RANGE_TOP = 29400


def _port_ranges():
    """The ports rank 0 may pick from: above the kernel's highest ephemeral
    port, and [20000, 29400) below its lowest (ip_local_port_range), so the
    local end of a connection this host opens meanwhile (the agreement
    round's own, UCX's, the engine's) cannot take the port before the group
    listens, as it can one bind(0) reported free."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default range
    return [(a, b) for a, b in ((high + 1, 65536), (20000, min(low, _LOW_RANGE_TOP)))
            if b - a >= 64]


# Ports tried before falling back to the kernel's pick.
_PORT_TRIES = 256


def _families(host):
    """The address families the group's listener may take for `host`: an
    address's own, or for a name (None: any) IPv4 and IPv6 both."""
    ip = _ip(host) if host else None
    if ip is not None:
        return [socket.AF_INET6 if ip.version == 6 else socket.AF_INET]
    return [socket.AF_INET, socket.AF_INET6] if socket.has_ipv6 else [socket.AF_INET]


def _bindable(port, families):
    """Whether nothing is bound to `port` in any of `families` (a family
    this machine lacks does not count)."""
    for family in families:
        try:
            s = socket.socket(family)
        except OSError:  # no such family here
            continue
        with s:
            try:
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind(("::" if family == socket.AF_INET6 else "", port))
            except OSError:
                return False
    return True


def free_port(rng=None, host=None):
    """A TCP port nothing on this machine is bound to now, outside the
    kernel's ephemeral range (_port_ranges), for rank 0 to publish: a
    group's bootstrap listens there, on `host` (its family decides which
    binds count; a name or None: IPv4 and IPv6 both). The kernel's pick
    (bind(0)) only when no port outside that range is free. rng:
    randrange's source (a random.SystemRandom by default)."""
    import random
    rng = rng or random.SystemRandom()
    families = _families(host)
    ranges = _port_ranges()
    total = sum(b - a for a, b in ranges)
    for _ in range(_PORT_TRIES if ranges else 0):
        i = rng.randrange(total)
        for a, b in ranges:
            if i < b - a:
                port = a + i
                break
            i -= b - a
        if _bindable(port, families):
            return port
    for family in families:
        try:
            s = socket.socket(family)
        except OSError:
            continue
        with s:
            s.bind(("::" if family == socket.AF_INET6 else "", 0))
            return s.getsockname()[1]
    raise OSError("no socket family of %s is available on this machine" % host)


def group_keys(ch, want_address, tokens, given=None, check_given=False):
    """One round over `ch` when a group is created: rank 0's free port
    (want_address), the largest of the ranks' derived token caps (tokens,
    or None), so ranks whose first batches differ still create one
    configuration, and, with check_given (the normal-mode group, whose cap
    a rank may be given by moe_ep_config or MOE_EP_HT_MAX_TOKENS_PER_RANK),
    the given caps, which must be the same on every rank (every rank raises
    alike when not: a cap the Buffer derived may grow later, a given one
    never does, and that choice takes the channel on every rank or on
    none). Every rank takes the round, whatever it wants from it (ranks
    whose environments differ, one with MOE_EP_BOOTSTRAP_ADDRESS and one
    without, must not split between gathering and not). Without a channel:
    (None, tokens)."""
    if ch is None:
        return None, tokens
    mine = [None, tokens, given]
    if want_address and ch.rank == 0:
        host = bootstrap_host()
        mine[0] = address_of(host, free_port(host=host))
    everyone = ch.gather(mine)
    givens = [e[2] for e in everyone]
    if check_given and len(set(givens)) > 1:
        raise ValueError(
            "Buffer: the ranks were given different normal-mode max_tokens_per_rank "
            "(moe_ep_config, %s or %s): %s; give every rank the same"
            % (HT_TOKENS_ENV, TOKENS_ENV, ", ".join("rank %d %s" % (r, "none" if v is None else v)
                                        for r, v in enumerate(givens))))
    derived = [e[1] for e in everyone if e[1] is not None]
    return everyone[0][0], (max(derived) if derived else None)


def job_token(ch, name, failure=None):
    """A group of more than one rank admits only processes that hold the
    job token (the variable `name`). When no rank has one, rank 0 draws one
    at random and the channel carries it to the others (the one time a
    token crosses the network: on the engine's own connections). Ranks
    that were given tokens compare only their SHA-256, and raise here,
    every rank alike, when they differ or when some ranks have none. A
    token a Buffer put there counts as none, so a Buffer over other ranks
    agrees afresh. One round; without a channel whoever starts the ranks
    sets the variable. os.environ is written at group creation, when no
    other thread should be reading the environment (as with DeepEP's Buffer
    constructor). failure: the exception this rank met building its
    group's config since the round before (its environment, which may
    differ from its peers'): it rides in this round, so every rank raises
    (this one its own exception, the others a ValueError naming it)
    instead of the others waiting in a round it skipped."""
    if ch is None or ch.size < 2:
        if failure is not None:
            raise failure
        return
    mine = os.environ.get(name) or None if name else None
    if mine is not None and _AGREED_TOKENS.get(name) == mine:
        mine = None
    digest = hashlib.sha256(mine.encode()).hexdigest() if mine is not None else None
    drawn = secrets.token_hex(16) if ch.rank == 0 else None
    everyone = ch.gather((digest, drawn if digest is None else None,
                          None if failure is None else str(failure)))
    failed = [(r, e[2]) for r, e in enumerate(everyone) if e[2] is not None]
    if failure is not None:
        raise failure
    if failed:
        raise ValueError("Buffer: rank %d could not build its group's config (%s); every rank "
                         "raises, and no group is created" % failed[0])
    given, none = {}, []
    for r, e in enumerate(everyone):
        d = e[0]
        if d is None:
            none.append(r)
        else:
            given.setdefault(d, []).append(r)
    if len(given) > 1:
        sets = "; ".join("ranks %s hold one" % ", ".join(map(str, ranks))
                         for ranks in given.values())
        raise ValueError("Buffer: the ranks' job tokens in %s differ (%s); set one "
                         "secret on every rank, or on none and the Buffer agrees one"
                         % (name, sets))
    if given and none:
        raise ValueError("Buffer: ranks %s have a job token in %s and ranks %s have none; "
                         "set one secret on every rank, or on none and the Buffer "
                         "agrees one" % (", ".join(map(str, next(iter(given.values())))),
                                         name, ", ".join(map(str, none))))
    if given:
        return
    token = everyone[0][1]
    os.environ[name] = token
    _AGREED_TOKENS[name] = token


def ranks_with(ch, mine, my_rank):
    """The ranks for which `mine` is true: every rank's answer over the
    channel (so every rank learns the same list), or this rank's alone
    without one."""
    if ch is None:
        return [my_rank] if mine else []
    return [r for r, v in enumerate(ch.gather(bool(mine))) if v]
