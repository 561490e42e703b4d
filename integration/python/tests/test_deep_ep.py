"""The DeepEP-compatible Buffer (LL and normal mode) on 2 ranks, imported
through the opt-in deep_ep alias, and the alias's discovery."""
import os
import subprocess
import sys

from spawn import PY_ROOT, run_ranks

ALIAS = os.path.join(PY_ROOT, "alias")


def test_deep_ep_buffer_two_ranks():
    # No job token in the environment: the Buffer agrees one over its
    # torch.distributed group (the worker checks it did).
    ok, report = run_ranks(2, "deep_ep_worker.py", extra_path=[ALIAS], token=None)
    assert ok, report


def test_deep_ep_buffer_four_ranks():
    ok, report = run_ranks(4, "deep_ep_worker.py", extra_path=[ALIAS], timeout=240)
    assert ok, report


def test_alias_is_found_the_way_vllm_looks():
    code = ("import importlib.util, sys; spec = importlib.util.find_spec('deep_ep'); "
            "assert spec is not None, 'find_spec found nothing'; "
            "import deep_ep, moe_ep.deep_ep; "
            "assert deep_ep.Buffer is moe_ep.deep_ep.Buffer; "
            "assert deep_ep.EventOverlap is moe_ep.deep_ep.EventOverlap; "
            "from deep_ep.utils import EventHandle, EventOverlap; print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ALIAS, PY_ROOT]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_alias_is_opt_in():
    """Importing the package does not make `deep_ep` resolve to moe-ep's
    Buffer (a real DeepEP installed elsewhere may still be found)."""
    code = ("import importlib.util, moe_ep; s = importlib.util.find_spec('deep_ep'); "
            "print(s is None or not (s.origin or '').startswith(%r))" % PY_ROOT)
    env = dict(os.environ, PYTHONPATH=PY_ROOT)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip() == "True", r.stdout + r.stderr
