"""The exception hierarchy: one ckpt.Error subclass per status code.

The extension raises ``error_class(code)(message)`` for every non-OK status
of the C++ library, with the library's message (which names the file, the
entry, and the expected and actual values). Subclasses also derive from the
built-in exception users already catch where one fits.
"""


class Error(Exception):
    """Base class of every error the ckpt library reports."""


class CancelledError(Error):
    """The operation was cancelled."""


class UnknownError(Error):
    """An error of unknown kind."""


class InvalidArgumentError(Error, ValueError):
    """Bad caller input: a shape or dtype mismatch, a bad name or region."""


class DeadlineExceededError(Error, TimeoutError):
    """A deadline passed."""


class NotFoundError(Error, FileNotFoundError, KeyError):
    """A missing checkpoint, file or entry."""

    def __str__(self):  # KeyError would quote the message
        return Exception.__str__(self)


class AlreadyExistsError(Error, FileExistsError):
    """A checkpoint of that step, or a name, exists already."""

    def __str__(self):
        return Exception.__str__(self)


class PermissionDeniedError(Error, PermissionError):
    """The storage refused access."""

    def __str__(self):
        return Exception.__str__(self)


class ResourceExhaustedError(Error, MemoryError):
    """Out of memory or another resource."""


class FailedPreconditionError(Error, RuntimeError):
    """A newer format version, an unknown required feature, or a strict load
    that leaves checkpoint entries unrequested."""


class AbortedError(Error):
    """The operation was aborted."""


class OutOfRangeError(Error, IndexError):
    """A position past the end."""


class UnimplementedError(Error, NotImplementedError):
    """Not supported by this version."""


class InternalError(Error):
    """An internal error, e.g. a failed collective."""


class UnavailableError(Error):
    """A transient failure."""


class DataLossError(Error):
    """Corrupt or truncated bytes: a checksum failure, a short file."""


class UnauthenticatedError(Error):
    """Not authenticated."""


# absl::StatusCode values.
_BY_CODE = {
    1: CancelledError,
    2: UnknownError,
    3: InvalidArgumentError,
    4: DeadlineExceededError,
    5: NotFoundError,
    6: AlreadyExistsError,
    7: PermissionDeniedError,
    8: ResourceExhaustedError,
    9: FailedPreconditionError,
    10: AbortedError,
    11: OutOfRangeError,
    12: UnimplementedError,
    13: InternalError,
    14: UnavailableError,
    15: DataLossError,
    16: UnauthenticatedError,
}


def error_class(code: int) -> type:
    """The exception class of an absl::StatusCode (Error for unknown ones)."""
    return _BY_CODE.get(code, Error)
