"""State the package keeps on a moe_ep.Group for everything that uses it
(the adapters' shared LL receive ring, the pending-receive book)."""
import threading

_creation = threading.Lock()


def kept_on(group, attribute, make):
    """group's `attribute`, made by make() on first use and kept on the
    group, so it lives and dies with it. Safe from any thread: two first
    calls at once get the same object."""
    obj = getattr(group, attribute, None)
    if obj is None:
        with _creation:
            obj = getattr(group, attribute, None)
            if obj is None:
                obj = make()
                setattr(group, attribute, obj)
    return obj
