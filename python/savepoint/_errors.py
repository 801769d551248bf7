"""Exception types: one per C++ StatusCode, all subclasses of SavepointError.

Each also derives from the built-in exception a Python user would catch for that situation
(NotFoundError is a FileNotFoundError, AlreadyExistsError a FileExistsError, ...). The message is
the C++ Status message unchanged: it names the checkpoint, file, tensor, chunk and byte offset.
"""

from . import _core


class SavepointError(Exception):
    """Base class of every error raised by the savepoint C++ core."""

    #: The C++ StatusCodeName of the error, e.g. "corruption".
    code = "unknown"


class InvalidArgumentError(SavepointError, ValueError):
    """A bad option, name, dtype or shape: the caller's fault."""

    code = "invalid argument"


# The name the issue tracker and users reach for; the same class.
InvalidConfigError = InvalidArgumentError


class NotFoundError(SavepointError, FileNotFoundError):
    """The checkpoint, file or tensor does not exist."""

    code = "not found"


class AlreadyExistsError(SavepointError, FileExistsError):
    """The target checkpoint exists and overwrite was not requested."""

    code = "already exists"


class CorruptCheckpointError(SavepointError):
    """On-disk data failed a checksum or structural check (the message names tensor and chunk)."""

    code = "corruption"


class SavepointIOError(SavepointError, OSError):
    """The operating system reported an I/O failure."""

    code = "I/O error"


class NoSpaceError(SavepointIOError):
    """ENOSPC / EDQUOT."""

    code = "no space"


class UnimplementedError(SavepointError, NotImplementedError):
    """A feature or format version this build does not support."""

    code = "unimplemented"


class FailedPreconditionError(SavepointError, RuntimeError):
    """The state does not allow the call."""

    code = "failed precondition"


class OutOfRangeError(SavepointError):
    """A read past the end of a file or buffer."""

    code = "out of range"


class PermissionDeniedError(SavepointError, PermissionError):
    """EACCES / EPERM / EROFS."""

    code = "permission denied"


class ResourceExhaustedError(SavepointError):
    """A size cap was exceeded."""

    code = "resource exhausted"


class InternalError(SavepointError, RuntimeError):
    """A bug in savepoint."""

    code = "internal"


class DeadlineExceededError(SavepointError, TimeoutError):
    """A collective operation between ranks timed out."""

    code = "deadline exceeded"


class AuthenticationError(SavepointError):
    """Encrypted data failed to decrypt or authenticate: a wrong key, or the data was modified.

    The message names the file and the block or chunk. It is not a CorruptCheckpointError: with
    the right key the checkpoint may be intact.
    """

    code = "unauthenticated"


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        CorruptCheckpointError,
        SavepointIOError,
        NoSpaceError,
        UnimplementedError,
        FailedPreconditionError,
        OutOfRangeError,
        PermissionDeniedError,
        ResourceExhaustedError,
        InternalError,
        DeadlineExceededError,
        AuthenticationError,
    )
}


def _register():
    table = {}
    for name, number in _core.STATUS_CODES.items():
        if name == "ok":
            continue
        if name not in _BY_CODE:
            raise ImportError(f"savepoint: no exception class for status code {name!r}")
        table[number] = _BY_CODE[name]
    _core._set_error_classes(table)


_register()
