"""moe_ep.sglang.Dispatcher's normal (prefill) mode and deepep_mode: real
processes on the host backend (2 and 4 ranks), values against the oracle;
and, in this process, the mode choice and the format stand-ins with no
SGLang importable."""
import enum
import sys

import pytest

from spawn import run_ranks


def test_normal_and_auto_two_ranks():
    ok, report = run_ranks(2, "sglang_normal_worker.py")
    assert ok, report


def test_normal_and_auto_four_ranks():
    ok, report = run_ranks(4, "sglang_normal_worker.py")
    assert ok, report


@pytest.fixture
def no_sglang(monkeypatch):
    """SGLang's dp_attention made unimportable, wherever SGLang is installed."""
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.dp_attention", None)


class DeepEPMode(enum.Enum):
    normal = "normal"              # SGLang's older member names
    low_latency = "low_latency"
    auto = "auto"


class Decode:
    def __init__(self, decode):
        self.decode = decode

    def is_decode(self):
        return self.decode


def test_mode_resolution(no_sglang):
    from moe_ep.sglang import _mode
    assert [_mode.parse_mode(m) for m in DeepEPMode] == ["normal", "low_latency", "auto"]
    for bad in ("Normal", "", None, 1):
        with pytest.raises(ValueError, match="deepep_mode=.* must be one of 'low_latency', "
                                             "'normal', 'auto'"):
            _mode.parse_mode(bad)
    assert _mode.resolve("normal", "dispatch_a") == "normal"
    assert _mode.resolve("low_latency", "dispatch_a", is_extend_in_batch=True) == "low_latency"
    assert _mode.resolve("auto", "dispatch_a", is_extend_in_batch=True) == "normal"
    assert _mode.resolve("auto", "dispatch_a", is_extend_in_batch=0) == "low_latency"
    assert _mode.resolve("auto", "dispatch_a", forward_mode=Decode(True)) == "low_latency"
    assert _mode.resolve("auto", "dispatch_a", forward_mode=Decode(False)) == "normal"

    class OldBatch:  # an SGLang ForwardBatch from before is_extend_in_batch
        forward_mode = Decode(False)
    assert _mode.resolve("auto", "dispatch_a", forward_batch=OldBatch()) == "normal"
    # The forward_mode era passed its ForwardMode where a forward batch goes
    # (fourth positional of dispatch and combine).
    assert _mode.resolve("auto", "dispatch_a", forward_batch=Decode(True)) == "low_latency"
    assert _mode.hinted("auto", "combine_a", forward_batch=Decode(False)) == "normal"
    assert _mode.is_mode_hint(Decode(True)) and _mode.is_mode_hint(OldBatch())
    assert not _mode.is_mode_hint(object())
    with pytest.raises(TypeError, match="forward_mode given twice"):
        _mode.resolve("auto", "dispatch_a", forward_batch=Decode(True), forward_mode=Decode(True))
    with pytest.raises(ValueError, match="deepep_mode='auto' needs to know"):
        _mode.resolve("auto", "dispatch_a")
    with pytest.raises(TypeError, match=r"forward_mode \(object\) has no is_decode"):
        _mode.resolve("auto", "dispatch_a", forward_mode=object())
    assert _mode.hinted("auto", "combine_a") is None
    assert _mode.hinted("normal", "combine_a", is_extend_in_batch=False) is None


def test_format_stand_ins(no_sglang):
    from moe_ep.sglang import _types
    n, ll = _types.NormalFormat(), _types.LowLatencyFormat()
    assert (n.is_deepep_normal(), n.is_deepep_ll(), n.is_deepep(), n.is_standard()) == \
        (True, False, True, False)
    assert (ll.is_deepep_normal(), ll.is_deepep_ll(), ll.is_deepep(), ll.is_standard()) == \
        (False, True, True, False)
    assert n.value == "deepep_normal" and ll.value == "deepep_ll"


def test_constructor_without_groups():
    from moe_ep.sglang import Dispatcher
    with pytest.raises(ValueError, match="give group="):
        Dispatcher()
    with pytest.raises(TypeError, match="group must be a moe_ep.Group, got object"):
        Dispatcher(object())
    with pytest.raises(TypeError, match="normal_group must be a moe_ep.Group, got str"):
        Dispatcher(normal_group="ht")
