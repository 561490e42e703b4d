"""The ctypes mirror of moe_ep.h against the offsets and sizes that
tests/plugin/abi_layout_test.cc pins for the C side."""
import ctypes
import os
import re

from moe_ep import _abi
from spawn import REPO

PINNED = os.path.join(REPO, "tests", "plugin", "abi_layout_test.cc")
MIRROR = {
    "moe_ep_tensor_t": _abi.Tensor, "moe_ep_config_t": _abi.Config,
    "moe_ep_group_params_t": _abi.GroupParams, "moe_ep_group_info_t": _abi.GroupInfo,
    "moe_ep_prepare_params_t": _abi.PrepareParams, "moe_ep_dispatch_params_t": _abi.DispatchParams,
    "moe_ep_combine_params_t": _abi.CombineParams, "moe_ep_plugin_v1_t": _abi.PluginV1,
    "moe_ep_device_t": _abi.Device, "moe_ep_data_type_t": _abi.DataType,
    "moe_ep_handle_layout_params_t": _abi.HandleLayoutParams,
}


def pins():
    text = open(PINNED).read()
    offsets = re.findall(r"PIN\((moe_ep_\w+), (\w+), (\d+)\)", text)
    sizes = re.findall(r"EXPECT_EQ\(sizeof\((moe_ep_\w+)\), (\d+)u?\)", text)
    return offsets, sizes


def test_every_pinned_offset_matches():
    offsets, _ = pins()
    assert len(offsets) > 60, "found only %d PIN lines in %s" % (len(offsets), PINNED)
    bad = ["%s.%s: C %s, ctypes %s" % (t, f, off, getattr(MIRROR[t], f).offset)
           for t, f, off in offsets if getattr(MIRROR[t], f).offset != int(off)]
    assert not bad, bad


def test_every_pinned_size_matches():
    _, sizes = pins()
    assert sizes
    bad = ["%s: C %s, ctypes %d" % (t, n, ctypes.sizeof(MIRROR[t]))
           for t, n in sizes if ctypes.sizeof(MIRROR[t]) != int(n)]
    assert not bad, bad


def test_flags_match_the_header():
    text = open(os.path.join(REPO, "plugin", "include", "moe_ep.h")).read()
    for name, value in (("DEFER_RECV", _abi.FLAG_DEFER_RECV), ("ROUND_SCALE", _abi.FLAG_ROUND_SCALE),
                        ("WORST_CASE", _abi.FLAG_WORST_CASE)):
        m = re.search(r"#define MOE_EP_FLAG_%s \(1u << (\d+)\)" % name, text)
        assert m and 1 << int(m.group(1)) == value, name
