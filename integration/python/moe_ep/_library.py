"""Finding, opening and checking libmoe_ep.so, and calling its table.

The checks are moe_ep_loader.h's: the exported symbol, abi_version, and a
table at least as large as the v1 entries this package calls.
"""
import ctypes
import os
import threading

from . import _abi
from .errors import LoadError, UnsupportedError, error_for

LIBRARY_NAME = "libmoe_ep.so"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def candidate_paths(path=None):
    """Where the library is looked for, in order: the argument,
    $MOE_EP_LIBRARY, the package folder, the source tree's Bazel output."""
    if path:
        return [path]
    env = os.environ.get("MOE_EP_LIBRARY")
    if env:
        return [env]
    found = [os.path.join(_PACKAGE_DIR, LIBRARY_NAME)]
    # integration/python/moe_ep -> repository root, when run from the tree.
    repo = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", ".."))
    found.append(os.path.join(repo, "bazel-bin", "plugin", LIBRARY_NAME))
    return found


class Library:
    """An opened libmoe_ep.so and its v1 table. Entries are cached as
    attributes (bound once: reading a function field from a ctypes struct
    builds a new object each time)."""

    def __init__(self, path=None):
        tried = []
        for p in candidate_paths(path):
            if path is None and not os.path.exists(p):
                tried.append(p)
                continue
            self._open(p)
            return
        raise LoadError(
            "moe_ep: %s not found (tried %s); pass its path, set MOE_EP_LIBRARY, "
            "or build it with `bazel build //plugin:libmoe_ep.so`"
            % (LIBRARY_NAME, ", ".join(tried)))

    def _open(self, path):
        try:
            dll = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOW", 2) | ctypes.RTLD_LOCAL)
        except OSError as e:
            raise LoadError("moe_ep: cannot open '%s': %s" % (path, e)) from None
        try:
            head = _abi.PluginV1.in_dll(dll, _abi.SYMBOL)
        except ValueError:
            raise LoadError(
                "moe_ep: '%s' exports no %s table (not a moe_ep library, or one "
                "older than ABI v1)" % (path, _abi.SYMBOL)) from None
        if head.abi_version != _abi.ABI_VERSION:
            raise LoadError(
                "moe_ep: '%s' table %s reports abi_version %d, this package was "
                "written for %d" % (path, _abi.SYMBOL, head.abi_version, _abi.ABI_VERSION))
        if head.struct_size < _abi.MIN_V1_SIZE:
            raise LoadError(
                "moe_ep: '%s' table %s is %d bytes, too old: this package needs at "
                "least %d" % (path, _abi.SYMBOL, head.struct_size, _abi.MIN_V1_SIZE))
        names = [name for name, _ in _abi.PluginV1._fields_[3:]]
        for name in names[:names.index("handle_free") + 1]:
            if not getattr(head, name):
                raise LoadError(
                    "moe_ep: '%s' table %s has no '%s' entry (NULL); every entry up to "
                    "handle_free is required" % (path, _abi.SYMBOL, name))
        self.path = path
        self._dll = dll  # keeps the library mapped while any object uses it
        self.table = head
        # An entry past the table's size (a library older than the entry)
        # is None: the method using it raises UnsupportedError.
        for name, _ in _abi.PluginV1._fields_[3:]:
            present = _abi.has_field(head, name) and bool(getattr(head, name))
            setattr(self, name, getattr(head, name) if present else None)
        major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self.get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        self.version = (major.value, minor.value, patch.value)

    def entry(self, name):
        """The table entry `name`, or UnsupportedError naming the library's
        version when its table predates it."""
        fn = getattr(self, name)
        if fn is None:
            raise UnsupportedError(
                "moe_ep: %s: the library '%s' (version %d.%d.%d) predates this entry; it "
                "needs moe-ep %s or later"
                % ((name, self.path) + tuple(self.version)
                   + (_abi.ENTRY_SINCE.get(name, "a later version"),)), name)
        return fn

    def error(self, status, entry):
        """The exception for a failed entry. Call it on the thread that made
        the call, right after it: last_error is per thread."""
        msg = self.last_error()
        text = msg.decode("utf-8", "replace") if msg else ""
        if not text:
            name = self.status_string(status)
            text = "%s failed: %s" % (entry, name.decode() if name else status)
        return error_for(status, text, entry)

    def check(self, status, entry):
        if status != _abi.OK:
            raise self.error(status, entry)


_default = None
_default_lock = threading.Lock()


def resolve(library):
    """A Library from what callers pass as `library`: a Library itself, a
    path, or None for the process-wide default (load())."""
    if isinstance(library, Library):
        return library
    return load(os.fspath(library) if library is not None else None)


def load(path=None):
    """The library at `path`, or the process-wide default one (opened on
    first use from candidate_paths())."""
    global _default
    if path is not None:
        return Library(path)
    with _default_lock:
        if _default is None:
            _default = Library()
        return _default
