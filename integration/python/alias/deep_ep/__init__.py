"""Opt-in alias: with integration/python/alias on PYTHONPATH, `import
deep_ep` (and importlib.util.find_spec("deep_ep"), which is how vLLM looks
for DeepEP) finds moe-ep's DeepEP-compatible Buffer."""
from moe_ep.deep_ep import *  # noqa: F401,F403
from moe_ep.deep_ep import __all__  # noqa: F401
