"""One exception class per moe_ep_status_t, all under moe_ep.Error.

The message is the library's own sentence (last_error), which names the
argument, its value and the rule it broke.
"""


class Error(RuntimeError):
    """A non-OK status from libmoe_ep.so. `status` is the numeric code,
    `entry` the table entry that returned it."""

    status = None

    def __init__(self, message, entry=None):
        super().__init__(message)
        self.entry = entry


class InvalidArgumentError(Error, ValueError):
    status = 1


class ConfigError(Error, ValueError):
    status = 2


class UnsupportedError(Error, NotImplementedError):
    status = 3


class NoMemoryError(Error, MemoryError):
    status = 4


class BootstrapError(Error):
    status = 5


class PeerFailedError(Error):
    status = 6


class TimeoutError(Error):  # noqa: A001 - mirrors MOE_EP_ERR_TIMEOUT
    status = 7


class MismatchError(Error):
    status = 8


class CudaError(Error):
    status = 9


class NcclError(Error):
    status = 10


class UcxError(Error):
    status = 11


class BusyError(Error):
    status = 12


class InternalError(Error):
    status = 13


class LoadError(Error, OSError):
    """The library could not be found or is not a usable moe_ep ABI v1."""


_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, ConfigError, UnsupportedError, NoMemoryError,
    BootstrapError, PeerFailedError, TimeoutError, MismatchError, CudaError,
    NcclError, UcxError, BusyError, InternalError)}


def error_for(status, message, entry=None):
    """The exception object for a status code (unknown codes: Error)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        err = Error("%s (status %d)" % (message, status), entry)
        err.status = status
        return err
    return cls(message, entry)
