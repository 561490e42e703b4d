"""Engine modules imported only where the engine is installed, and only on
first use: the adapters import without vLLM or SGLang."""
import importlib
import importlib.util
import sys


def optional_module(name):
    """Module `name`, or None where its top-level package is not importable
    (or the module itself fails to import)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    if importlib.util.find_spec(name.partition(".")[0]) is None:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
