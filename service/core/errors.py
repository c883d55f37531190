"""Every failure qstate names, under one root, each with its HTTP status and gRPC code.

An error crosses a gRPC boundary as its code and message, with its class name and detail in
trailing metadata (``grpc_trailers``), and comes back as the same class (``from_grpc``), so
no caller decides what happened by reading a message. Over HTTP its body is
``{"error": <class name>, "message": ..., **detail}`` (``qstate.core.answer.ErrorBody``
documents it) and ``from_http`` reads it back.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import grpc

# No __all__: the classes are this module's public names, found by error_classes() and exported
# by qstate.errors (a star import, which type checkers follow) without a list to keep


class QStateError(Exception):
    """The root: anything qstate raises on purpose."""

    http_status: ClassVar[int] = 500
    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def body(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, **self.detail}


class EngineFailed(QStateError):
    """The router's read engine failed inside (a panic, caught): the request is answered 500
    with this message, and the engine goes on answering others (docs/architecture.md §5)."""


class InvalidRequest(QStateError):
    """A request (or argument) that cannot be answered as asked; the message says what to fix."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidAddress(InvalidRequest):
    """A name or key that docs/architecture.md §2 does not allow; the message says what is
    allowed."""


class TooLarge(InvalidRequest):
    """A request body beyond the router's limit (``max_body_bytes``)."""

    http_status = 413


class Unauthenticated(QStateError):
    """No credential, or one nobody issued: a client token at the router, the cluster token
    at a shard. The message says which was expected; it never repeats what was sent."""

    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class Forbidden(QStateError):
    """A valid token whose scopes do not cover the job (or operator) asked for."""

    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED


class NotFound(QStateError):
    """Unknown job/operator/state, or no data for a key (then ``batch`` says as of when)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class UnknownOperator(NotFound):
    """A job, operator or state that checkpoint storage does not know."""


class Unavailable(QStateError):
    """The owning shard is down, restoring or moving: retry after ``retry_after_s``.
    ``reason``, a short fixed word (restoring, shard-down, ...), labels the router's metric
    of 503 answers; the message says the rest."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, retry_after_s: float = 1.0, *,
                 reason: str = "unavailable", **detail: Any) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **detail)
        self.retry_after_s = retry_after_s
        self.reason = reason


class Overloaded(QStateError):
    """More work than a router takes at once (requests in flight, keys queued for one
    shard): retry after ``retry_after_s``. Answered at once, never after a wait."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float = 1.0, **detail: Any) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **detail)
        self.retry_after_s = retry_after_s


class StaleEpoch(QStateError):
    """A writer with an older assignment epoch than the shard knows: a newer coordinator owns
    the job's assignment. Its own code, so callers tell it from every other refusal."""

    http_status = 409
    grpc_code = grpc.StatusCode.ABORTED


class NotOwner(QStateError):
    """The committer thinks this server owns a partition the assignment gives elsewhere."""

    http_status = 409
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class DeltaMismatch(QStateError):
    """A delta file or batch manifest is missing, corrupt or not what was announced."""

    grpc_code = grpc.StatusCode.DATA_LOSS


class CorruptState(DeltaMismatch):
    """Bytes of a partition's store (a RocksDB key or value) that do not parse as its layout
    says: the partition must be restored from its snapshot and deltas."""


class CommitFailed(QStateError):
    """A batch could not be committed on every owning shard within the commit bound."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


class Fenced(CommitFailed):
    """Another coordinator of the job took over: this driver must stop writing."""

    http_status = 409
    grpc_code = grpc.StatusCode.ABORTED


class StartFailed(QStateError):
    """A process qstate starts could not start: no Java, it exited, its port never opened."""


class BrokerError(StartFailed):
    """The embedded Kafka broker could not be started or reached."""


class BadRecord(QStateError):
    """An event that does not fit the declared fields; ``reason`` goes to the dead-letter
    headers, ``kind`` (a short fixed word) to the metric label."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, reason: str, kind: str = "invalid") -> None:
        super().__init__(reason, kind=kind)
        self.reason = reason
        self.kind = kind


# What a remote refusal means, by code. UNAVAILABLE and DEADLINE_EXCEEDED are transport
# conditions as much as answers, so they stay grpc.RpcError for callers to retry.
_BY_CODE: dict[grpc.StatusCode, type[QStateError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ABORTED: StaleEpoch,
    grpc.StatusCode.FAILED_PRECONDITION: NotOwner,
    grpc.StatusCode.DATA_LOSS: DeltaMismatch,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Forbidden,
}


_TRAILER_CLASS = "qstate-error"
_TRAILER_DETAIL = "qstate-detail"


def grpc_trailers(exc: QStateError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata that carries ``exc``'s class and detail to ``from_grpc``."""
    return ((_TRAILER_CLASS, type(exc).__name__),
            (_TRAILER_DETAIL, json.dumps(exc.detail, default=str)))


def from_grpc(exc: grpc.RpcError) -> QStateError | None:
    """The qstate error a remote process answered with, or None for transport failures."""
    code = exc.code()  # type: ignore[attr-defined]  # every RpcError a call raises has it
    trailers = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    cls = _by_name(str(trailers.get(_TRAILER_CLASS)))
    if cls is None or cls.grpc_code != code:
        cls = _BY_CODE.get(code)
        if cls is None:
            return None
        trailers = {}
    message = exc.details() or cls.__name__  # type: ignore[attr-defined]
    try:
        return cls(message, **json.loads(trailers.get(_TRAILER_DETAIL) or "{}"))
    except (TypeError, ValueError):
        return cls(message)


def from_http(status: int, body: dict[str, Any]) -> QStateError:
    """The error an HTTP answer carries (its ``error`` names the class), for clients."""
    detail = {k: v for k, v in body.items() if k not in ("error", "message")}
    message = str(body.get("message") or body.get("detail") or f"HTTP {status}")
    cls = _by_name(str(body.get("error")))
    if cls is None:
        cls = next((c for c in (InvalidRequest, Unauthenticated, Forbidden, NotFound,
                                TooLarge, Overloaded, Unavailable, StaleEpoch)
                    if c.http_status == status), QStateError)
    try:
        return cls(message, **detail)
    except TypeError:  # a body with fields this class does not take: keep the message
        return cls(message)


def error_classes() -> list[type[QStateError]]:
    """``QStateError`` and every class under it, wherever it is defined, root first: the
    names ``from_grpc`` and ``from_http`` know and ``__all__`` exports, found, never listed."""
    found: list[type[QStateError]] = []
    todo = [QStateError]
    while todo:
        cls = todo.pop(0)
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _by_name(name: str) -> type[QStateError] | None:
    """The class a remote answer names; walked at each call, so a class defined after this
    module (a plugin's, a test's) is found too. Nearest the root first if two share a name."""
    return next((c for c in error_classes() if c.__name__ == name), None)
