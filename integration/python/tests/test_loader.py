"""Loading the library through its table (the loader header's checks) and
configurations parsed by the library, in this process (no group)."""
import ctypes.util
import os
import re

import pytest

import moe_ep
from moe_ep import _abi
from moe_ep.config import dict_to_yaml
from spawn import REPO, library_path


def header_version():
    """(major, minor, patch) of plugin/include/moe_ep.h's MOE_EP_VERSION_*."""
    with open(os.path.join(REPO, "plugin", "include", "moe_ep.h")) as f:
        text = f.read()
    return tuple(int(re.search(r"#define MOE_EP_VERSION_%s (\d+)" % part, text).group(1))
                 for part in ("MAJOR", "MINOR", "PATCH"))


def test_loads_the_table_and_reports_the_version():
    lib = moe_ep.Library(library_path())
    assert lib.table.abi_version == _abi.ABI_VERSION
    assert lib.table.struct_size >= _abi.MIN_V1_SIZE
    assert lib.table.name == b"moe_ep"
    assert lib.version == header_version()


def test_the_table_has_the_entries_of_0_4():
    lib = moe_ep.Library(library_path())
    assert lib.version[:2] >= (0, 4)
    assert lib.handle_layout is not None
    assert lib.entry("handle_layout") is lib.handle_layout
    assert lib.entry("group_busy_hook") is lib.group_busy_hook is not None


def test_a_0_2_library_loads_without_the_later_entries():
    """A library whose table ends at handle_free (built against 0.2) loads;
    handle_layout is absent and asking for it says which library predates it."""
    old = os.path.join(os.path.dirname(os.path.dirname(library_path())), "tests", "plugin",
                       "libfake_v02_plugin.so")
    lib = moe_ep.Library(old)
    assert lib.version == (0, 2, 0)
    assert lib.table.struct_size == _abi.PluginV1.handle_layout.offset
    assert lib.handle_layout is None and lib.handle_free is not None
    with pytest.raises(moe_ep.UnsupportedError, match="predates this entry; it needs moe-ep 0.3"):
        lib.entry("handle_layout")
    assert lib.group_busy_hook is None
    with pytest.raises(moe_ep.UnsupportedError, match="predates this entry; it needs moe-ep 0.4"):
        lib.entry("group_busy_hook")


def test_a_format_the_library_predates_is_refused_naming_the_version():
    """Per-token HT rows (format 5) need 0.5: an older library would call
    the value out of range, so the package says which version it needs."""
    from moe_ep._ht import check_format_supported
    old = moe_ep.Library(os.path.join(os.path.dirname(os.path.dirname(library_path())), "tests",
                                      "plugin", "libfake_v02_plugin.so"))
    with pytest.raises(moe_ep.UnsupportedError,
                       match=r"format='fp8_per_token' needs moe-ep 0.5 or later; the library "
                             r"'.*libfake_v02_plugin.so' is version 0.2.0"):
        check_format_supported(old, "fp8_per_token")
    check_format_supported(old, "fp8_ue8m0_packed")
    check_format_supported(moe_ep.Library(library_path()), "fp8_per_token")


def test_a_table_with_a_null_entry_is_refused_naming_it():
    bad = os.path.join(os.path.dirname(os.path.dirname(library_path())), "tests", "plugin",
                       "libfake_null_plugin.so")
    with pytest.raises(moe_ep.LoadError, match="has no 'combine' entry \\(NULL\\)"):
        moe_ep.Library(bad)


def test_missing_file_names_the_path():
    with pytest.raises(moe_ep.LoadError, match="cannot open '/nonexistent/libmoe_ep.so'"):
        moe_ep.Library("/nonexistent/libmoe_ep.so")


def test_a_library_without_the_table_is_refused():
    libc = ctypes.util.find_library("c")
    with pytest.raises(moe_ep.LoadError, match="exports no moe_ep_plugin_v1 table"):
        moe_ep.Library(libc)


def test_search_order_starts_with_the_argument_then_the_environment(monkeypatch):
    assert moe_ep.candidate_paths("/x/lib.so") == ["/x/lib.so"]
    monkeypatch.setenv("MOE_EP_LIBRARY", "/y/lib.so")
    assert moe_ep.candidate_paths() == ["/y/lib.so"]
    monkeypatch.delenv("MOE_EP_LIBRARY")
    found = moe_ep.candidate_paths()
    assert found[0].endswith(os.path.join("moe_ep", "libmoe_ep.so"))
    assert found[1].endswith(os.path.join("bazel-bin", "plugin", "libmoe_ep.so"))


def test_config_from_dict_reads_back_effective_values():
    lib = moe_ep.Library(library_path())
    cfg = moe_ep.Config({"backend": "host", "num_experts": 64, "double_buffer": False,
                         "bootstrap": {"address": "10.0.0.1:1234"}}, lib)
    assert (cfg.backend, cfg.num_experts, cfg.double_buffer) == ("host", 64, False)
    assert cfg.bootstrap_address == "10.0.0.1:1234"
    assert cfg.hidden == 7168 and cfg.top_k == 8  # defaults
    assert cfg.buffer_size_hint(2) > 0


def test_config_ranks_per_node_from_a_dict_and_its_rules():
    lib = moe_ep.Library(library_path())
    assert moe_ep.Config(None, lib).ranks_per_node == 0  # unset
    cfg = moe_ep.Config({"backend": "host", "mode": "high_throughput", "transport": "gin_emulated",
                         "num_experts": 8, "ranks_per_node": 2}, lib)
    assert cfg.ranks_per_node == 2 and "ranks_per_node=2" in repr(cfg)
    assert cfg.buffer_size_hint(4) > 0
    # The world-size rules group_create applies, checked here without a group.
    with pytest.raises(moe_ep.InvalidArgumentError,
                       match=r"buffer_size_hint: ranks_per_node=2 does not divide world_size=1"):
        cfg.buffer_size_hint(1)
    lsa = moe_ep.Config({"backend": "host", "mode": "high_throughput", "transport": "lsa",
                         "num_experts": 8, "ranks_per_node": 2}, lib)
    assert lsa.buffer_size_hint(2) > 0  # the whole group: one node
    with pytest.raises(moe_ep.InvalidArgumentError, match=r"must be 0 or world_size=4"):
        lsa.buffer_size_hint(4)
    with pytest.raises(moe_ep.ConfigError,
                       match=r"config key 'ranks_per_node' = -1 \(line 2\) is out of range; "
                             r"allowed: integer 0\.\.1024"):
        moe_ep.Config({"ranks_per_node": -1}, lib)
    with pytest.raises(moe_ep.ConfigError, match=r"'two' is not an integer"):
        moe_ep.Config({"ranks_per_node": "two"}, lib)


def test_config_from_yaml_text_and_file(tmp_path):
    lib = moe_ep.Library(library_path())
    text = "model: x\nmoe_ep:\n  mode: high_throughput\n  hidden: 1024\n"
    assert moe_ep.Config(text, lib).mode == "high_throughput"
    path = tmp_path / "engine.yaml"
    path.write_text(text)
    assert moe_ep.Config(str(path), lib).hidden == 1024


def test_config_errors_carry_the_library_sentence():
    lib = moe_ep.Library(library_path())
    with pytest.raises(moe_ep.ConfigError, match="num_experts") as e:
        moe_ep.Config({"num_experts": 0}, lib)
    assert e.value.entry == "config_from_yaml"
    with pytest.raises(moe_ep.ConfigError, match="colour"):
        moe_ep.Config({"colour": "blue"}, lib)
    with pytest.raises(TypeError, match="hidden"):
        dict_to_yaml({"hidden": 1.5})


def test_every_status_has_its_exception_class():
    for status in range(1, 14):
        err = moe_ep.errors.error_for(status, "sentence", "entry")
        assert isinstance(err, moe_ep.Error) and err.status == status
        assert str(err) == "sentence"
    assert issubclass(moe_ep.InvalidArgumentError, ValueError)
    assert issubclass(moe_ep.UnsupportedError, NotImplementedError)


def test_a_host_group_refuses_a_communicator_before_any_bootstrap():
    lib = moe_ep.Library(library_path())
    cfg = moe_ep.Config({"backend": "host", "num_experts": 4, "hidden": 256, "top_k": 2,
                         "max_tokens_per_rank": 8}, lib)
    with pytest.raises(moe_ep.InvalidArgumentError, match=r"params->nccl_comm=.* host") as e:
        moe_ep.Group(cfg, rank=0, world_size=1, nccl_comm=0x1000, library=lib)
    assert e.value.entry == "group_create"


def test_a_group_of_two_ranks_needs_a_job_token(monkeypatch):
    lib = moe_ep.Library(library_path())
    cfg = moe_ep.Config({"backend": "host", "num_experts": 4, "hidden": 256, "top_k": 2,
                         "max_tokens_per_rank": 8,
                         "bootstrap": {"token_env": "MOE_EP_TEST_NO_SUCH_TOKEN"}}, lib)
    monkeypatch.delenv("MOE_EP_TEST_NO_SUCH_TOKEN", raising=False)
    with pytest.raises(moe_ep.InvalidArgumentError,
                       match=r"group_create on rank 1: the environment variable "
                             r"MOE_EP_TEST_NO_SUCH_TOKEN \(bootstrap.token_env\) is unset") as e:
        moe_ep.Group(cfg, rank=1, world_size=2, library=lib)
    assert e.value.entry == "group_create"
    monkeypatch.setenv("MOE_EP_TEST_NO_SUCH_TOKEN", "")
    with pytest.raises(moe_ep.InvalidArgumentError, match="is empty"):
        moe_ep.Group(cfg, rank=1, world_size=2, library=lib)
    # One character short of the rule.
    monkeypatch.setenv("MOE_EP_TEST_NO_SUCH_TOKEN", "f" * 15)
    with pytest.raises(moe_ep.InvalidArgumentError,
                       match=r"group_create on rank 1: the job token in MOE_EP_TEST_NO_SUCH_TOKEN "
                             r"\(bootstrap.token_env\) is 15 characters; a group of 2 ranks needs "
                             r"at least 16"):
        moe_ep.Group(cfg, rank=1, world_size=2, library=lib)
