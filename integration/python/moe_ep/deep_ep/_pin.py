"""The moe_ep.Config of a Buffer's group, and of its size hint, with the
keys the Buffer derives kept whatever the library-wide MOE_EP_<KEY>
overrides say: MOE_EP_MAX_TOKENS_PER_RANK (what an operator sets for
prefill) would otherwise change the low-latency group too, and
MOE_EP_MODE would turn one mode's group into the other's."""
import os

from ..config import Config as MoeEpConfig
from ..errors import ConfigError

MODE_ENV = "MOE_EP_MODE"
TOKENS_ENV = "MOE_EP_MAX_TOKENS_PER_RANK"
# The config keys a Buffer fills from DeepEP's arguments, by argument name,
# so a refusal of the value names what the caller passed.
FROM_ARGUMENT = {"max_tokens_per_rank": "num_max_dispatch_tokens_per_rank",
                 "hidden": "the hidden size (x.shape[-1], or hidden)",
                 "num_experts": "num_experts"}


def _parsed(cfg, lib, pins):
    """Config of cfg with `pins` set after the environment. The library
    checks max_tokens_per_rank against the mode's range while it parses,
    so when MOE_EP_MAX_TOKENS_PER_RANK is set and the cap is pinned, the
    text is parsed as high_throughput (the wider range, which holds a cap
    meant for the normal-mode group) and the mode pinned back;
    group_create checks the pinned values again."""
    text = dict(cfg)
    if "max_tokens_per_rank" in pins and os.environ.get(TOKENS_ENV):
        text["mode"] = "high_throughput"
    try:
        config = MoeEpConfig(text, lib)
        config.pin(**pins)
    except ConfigError as e:
        raise ConfigError("%s%s" % (e, _from_argument(str(e), cfg))) from None
    return config


def _from_argument(message, cfg):
    """A note naming the caller's argument behind the key the library's
    sentence names, when a Buffer fills that key from one."""
    for key, argument in FROM_ARGUMENT.items():
        if "'%s'" % key in message and key in cfg:
            return " (the Buffer's %s = %r: DeepEP's %s, or moe_ep_config's)" % (
                key, cfg[key], argument)
    return ""


def group_config(cfg, lib, mode):
    """The Config of the Buffer's `mode` group from its moe_ep: section
    `cfg`. The mode is the Buffer's (MOE_EP_MODE naming the other one
    raises ValueError, naming it); a low-latency group keeps the
    max_tokens_per_rank of cfg (num_max_dispatch_tokens_per_rank or
    moe_ep_config's), while MOE_EP_MAX_TOKENS_PER_RANK still sets the
    normal-mode group's."""
    env_mode = os.environ.get(MODE_ENV)
    if env_mode and env_mode.lower() != mode:
        raise ValueError(
            "Buffer: %s=%s would make the Buffer's %s group a %s one; a Buffer picks each "
            "group's mode by its calls (low_latency_* on a low_latency group, "
            "get_dispatch_layout / dispatch / combine on a high_throughput group): unset %s "
            "in processes that use the DeepEP Buffer" % (MODE_ENV, env_mode, mode,
                                                         env_mode.lower(), MODE_ENV))
    pins = {"mode": mode}
    if mode == "low_latency":
        pins["max_tokens_per_rank"] = int(cfg["max_tokens_per_rank"])
    return _parsed(cfg, lib, pins)


def ll_size_hint(lib, max_tokens, hidden, num_ranks, num_experts):
    """Bytes one rank's low-latency buffers take for these maxima (bf16 and
    fp8 rows fit the same buffers; top_k: the config's). The keys given
    are pinned, so an override meant for other groups (MOE_EP_MODE,
    MOE_EP_MAX_TOKENS_PER_RANK, MOE_EP_HIDDEN, MOE_EP_NUM_EXPERTS) neither
    changes the number nor makes the call raise (a value no group could
    take, such as a cap above every mode's range, still raises, naming
    its variable)."""
    keys = {"mode": "low_latency", "num_experts": int(num_experts), "hidden": int(hidden),
            "max_tokens_per_rank": int(max_tokens)}
    return _parsed(keys, lib, keys).buffer_size_hint(int(num_ranks))
