"""`deep_ep.utils` under the opt-in alias."""
from moe_ep.deep_ep.utils import *  # noqa: F401,F403
from moe_ep.deep_ep.utils import __all__  # noqa: F401
