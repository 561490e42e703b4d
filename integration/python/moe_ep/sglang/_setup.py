"""The Dispatcher's constructor arguments checked together: which groups
and options each deepep_mode takes. Anything a mode would never use is
refused rather than ignored, so a misconfigured engine fails at start-up,
naming the argument, not at its first prefill."""
from .. import _fp8
from ..group import Group
from . import _mode
from ._normal_options import FROM_SGLANG


def settle(group, normal_group, deepep_mode, weights_at_dispatch, normal_fp8,
           expert_alignment, ll_fp8_scale=None):
    """The dispatcher's mode ('low_latency', 'normal' or 'auto'), after
    every check; raises naming the argument, its value and the rule."""
    if group is not None:
        _check_group("group", group, "low_latency")
    if normal_group is not None:
        _check_group("normal_group", normal_group, "high_throughput")
    if group is None and normal_group is None:
        raise ValueError("Dispatcher: give group= (a low_latency group), normal_group= (a "
                         "high_throughput group) or both (deepep_mode 'auto')")
    mode = _default_mode(group, normal_group) if deepep_mode is None else \
        _mode.parse_mode(deepep_mode)
    _check_groups(mode, group, normal_group)
    if normal_fp8 not in (None, FROM_SGLANG) and normal_fp8 not in _fp8.SCALE_FORMATS:
        raise ValueError("Dispatcher: normal_fp8=%r must be %r (as SGLang's dispatcher), None "
                         "(rows as given) or one of %s (the scales of rows quantised before a "
                         "normal dispatch)"
                         % (normal_fp8, FROM_SGLANG,
                            ", ".join(repr(f) for f in _fp8.SCALE_FORMATS)))
    if ll_fp8_scale is not None:
        if ll_fp8_scale not in _fp8.SCALE_FORMATS:
            raise ValueError("Dispatcher: ll_fp8_scale=%r must be None (as SGLang asks DeepEP) "
                             "or one of %s" % (ll_fp8_scale,
                                               ", ".join(repr(f) for f in _fp8.SCALE_FORMATS)))
        if group is None or not group.config.fp8:
            raise ValueError("Dispatcher: ll_fp8_scale=%r needs a low-latency group that "
                             "dispatches fp8 (dispatch_dtype: fp8_e4m3)" % (ll_fp8_scale,))
    if expert_alignment is not None and (
            isinstance(expert_alignment, bool) or not isinstance(expert_alignment, int) or
            expert_alignment < 1):
        raise ValueError("Dispatcher: expert_alignment=%r must be None (as SGLang's "
                         "dispatcher) or an int >= 1 (SGLang uses 1, or 128 for DeepGEMM)"
                         % (expert_alignment,))
    _check_options(mode, weights_at_dispatch, normal_fp8, expert_alignment)
    return mode


def _check_group(name, group, want):
    if not isinstance(group, Group):
        raise TypeError("Dispatcher: %s must be a moe_ep.Group, got %s"
                        % (name, type(group).__name__))
    if group.mode == want:
        return
    if name == "group":
        raise NotImplementedError(
            "Dispatcher: the group's mode is %s; group= takes a low_latency group (SGLang's "
            "low-latency dispatcher); pass a high_throughput group as normal_group= for "
            "deepep_mode 'normal' or 'auto'" % group.mode)
    raise ValueError("Dispatcher: normal_group's mode is %s; SGLang's normal mode runs on a "
                     "high_throughput group (mode: high_throughput)" % group.mode)


def _default_mode(group, normal_group):
    if group is not None and normal_group is not None:
        return "auto"
    return "normal" if normal_group is not None else "low_latency"


def _check_groups(mode, group, normal_group):
    """The groups `mode` uses are given, and no other: a group the mode
    never calls is a configuration mistake, not something to ignore."""
    need = {"low_latency": ("group",), "normal": ("normal_group",),
            "auto": ("group", "normal_group")}[mode]
    given = {"group": group, "normal_group": normal_group}
    for name in need:
        if given[name] is None:
            raise ValueError("Dispatcher: deepep_mode=%r needs %s (a %s group)"
                             % (mode, name, "low_latency" if name == "group" else
                                "high_throughput"))
    for name in ("group", "normal_group"):
        if name not in need and given[name] is not None:
            raise ValueError("Dispatcher: deepep_mode=%r never uses %s; pass it only for "
                             "deepep_mode %s" % (mode, name, "'low_latency' or 'auto'"
                                                 if name == "group" else "'normal' or 'auto'"))
    if group is not None and normal_group is not None:
        for what, a, b in (("num_experts", group.config.num_experts,
                            normal_group.config.num_experts),
                           ("world_size", group.world_size, normal_group.world_size),
                           ("rank", group.rank, normal_group.rank)):
            if a != b:
                raise ValueError("Dispatcher: group has %s=%d and normal_group %d; both modes "
                                 "serve one expert-parallel layout" % (what, a, b))


def _check_options(mode, weights_at_dispatch, normal_fp8, expert_alignment):
    """An option of the mode the dispatcher never runs is a mistake, not
    something to ignore."""
    if mode == "normal" and not weights_at_dispatch:
        raise ValueError("Dispatcher: weights_at_dispatch=False with deepep_mode='normal': it is "
                         "a low-latency choice; normal mode always sends the router weights "
                         "with the tokens and the experts apply them")
    if mode == "low_latency":
        for name, value, default in (("normal_fp8", normal_fp8, FROM_SGLANG),
                                     ("expert_alignment", expert_alignment, None)):
            if value != default:
                raise ValueError("Dispatcher: %s=%r with deepep_mode='low_latency': it is a "
                                 "normal-mode option (deepep_mode 'normal' or 'auto')"
                                 % (name, value))
