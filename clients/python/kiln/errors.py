"""Exceptions: one class per server status, and the tracer's errors.

Every error from kilnd is a KilnError carrying the gRPC code and the server's
message (which names the field or the instruction); UNIMPLEMENTED is also a
NotImplementedError and INVALID_ARGUMENT also a ValueError, so code written
against JAX's exceptions catches them.
"""
import grpc


class KilnError(RuntimeError):
    """An error status from kilnd."""

    code = None

    def __init__(self, message, code=None, details=""):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.details = details


class InvalidArgumentError(KilnError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(KilnError, KeyError):
    code = grpc.StatusCode.NOT_FOUND

    def __str__(self):  # KeyError would quote the message
        return RuntimeError.__str__(self)


class ResourceExhaustedError(KilnError, MemoryError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceededError(KilnError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnavailableError(KilnError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class UnimplementedError(KilnError, NotImplementedError):
    code = grpc.StatusCode.UNIMPLEMENTED


class UnauthenticatedError(KilnError, PermissionError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(KilnError, PermissionError):
    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPreconditionError(KilnError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class CancelledError(KilnError):
    code = grpc.StatusCode.CANCELLED


class InternalError(KilnError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE = {c.code: c for c in (InvalidArgumentError, NotFoundError, ResourceExhaustedError,
                                DeadlineExceededError, UnavailableError, UnimplementedError,
                                UnauthenticatedError, PermissionDeniedError,
                                FailedPreconditionError, CancelledError, InternalError)}


def from_rpc_error(e, what):
    """The KilnError for a grpc.RpcError raised by the call `what`."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    cls = _BY_CODE.get(code, KilnError)
    name = code.name if code is not None else "UNKNOWN"
    return cls(f"{what}: {name}: {details}", code, details)


class ConcretizationTypeError(TypeError):
    """A traced value was used where Python needs a concrete one (if, while,
    int(), bool(), indexing a Python list)."""


class TracerArrayConversionError(TypeError):
    """np.asarray on a traced value."""


class UnexpectedTracerError(RuntimeError):
    """A traced value escaped the function being traced."""
