from __future__ import annotations

import inspect
from typing import Any

import grpc
import pytest

from qstate import errors as public_errors
from qstate.core import errors
from qstate.core.errors import (
    BadRecord,
    BrokerError,
    CommitFailed,
    CorruptState,
    DeltaMismatch,
    EngineFailed,
    Fenced,
    Forbidden,
    InvalidAddress,
    InvalidRequest,
    NotFound,
    NotOwner,
    Overloaded,
    QStateError,
    StaleEpoch,
    StartFailed,
    TooLarge,
    Unauthenticated,
    Unavailable,
    UnknownOperator,
    from_grpc,
    from_http,
    grpc_trailers,
)

Code = grpc.StatusCode

# What each class answers with over HTTP and gRPC (the contract routers, shards and clients
# share; see the class docstrings).
DOCUMENTED: dict[type[QStateError], tuple[int, grpc.StatusCode]] = {
    QStateError: (500, Code.INTERNAL),
    InvalidRequest: (400, Code.INVALID_ARGUMENT),
    InvalidAddress: (400, Code.INVALID_ARGUMENT),
    NotFound: (404, Code.NOT_FOUND),
    UnknownOperator: (404, Code.NOT_FOUND),
    Unavailable: (503, Code.UNAVAILABLE),
    StaleEpoch: (409, Code.ABORTED),
    NotOwner: (409, Code.FAILED_PRECONDITION),
    DeltaMismatch: (500, Code.DATA_LOSS),
    CorruptState: (500, Code.DATA_LOSS),
    CommitFailed: (503, Code.UNAVAILABLE),
    Fenced: (409, Code.ABORTED),
    StartFailed: (500, Code.INTERNAL),
    BrokerError: (500, Code.INTERNAL),
    BadRecord: (400, Code.INVALID_ARGUMENT),
    TooLarge: (413, Code.INVALID_ARGUMENT),
    Unauthenticated: (401, Code.UNAUTHENTICATED),
    Forbidden: (403, Code.PERMISSION_DENIED),
    Overloaded: (429, Code.RESOURCE_EXHAUSTED),
    EngineFailed: (500, Code.INTERNAL),
}


def sample(cls: type[QStateError]) -> QStateError:
    """An instance of ``cls`` with some detail, built through its public constructor."""
    if cls is BadRecord:
        return BadRecord("field 'n' is not a number", kind="type")
    if cls is Unavailable:
        return Unavailable("partition j/op/3 is restoring", retry_after_s=2.5, partition=3)
    if issubclass(cls, NotFound):
        return cls("key 'k' has no data", batch=311, watermark=1767225590000)
    return cls(f"a {cls.__name__}", job="j")


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str | None,
                 trailers: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailers


def test_every_error_class_is_documented_and_public() -> None:
    defined = {obj for obj in vars(errors).values()
               if inspect.isclass(obj) and issubclass(obj, Exception)}
    assert set(errors.error_classes()) >= defined == set(DOCUMENTED)
    # qstate.errors, the public name, exports each one (found, not listed)
    assert {getattr(public_errors, n) for n in public_errors.__all__} == set(DOCUMENTED)


class PlantedError(NotFound):
    """Defined here, after qstate.core.errors, and listed nowhere."""

    http_status = 410


def test_a_new_subclass_is_known_by_name_without_being_listed() -> None:
    exc = PlantedError("gone for good", batch=3)
    by_http = from_http(410, exc.body())
    assert type(by_http) is PlantedError and by_http.detail == {"batch": 3}
    by_grpc = from_grpc(FakeRpcError(exc.grpc_code, exc.message, grpc_trailers(exc)))
    assert type(by_grpc) is PlantedError and by_grpc is not None and by_grpc.detail == {"batch": 3}


@pytest.mark.parametrize("cls", list(DOCUMENTED))
def test_status_and_code(cls: type[QStateError]) -> None:
    assert (cls.http_status, cls.grpc_code) == DOCUMENTED[cls]
    exc = sample(cls)
    assert isinstance(exc, QStateError)
    assert (exc.http_status, exc.grpc_code) == DOCUMENTED[cls]


@pytest.mark.parametrize("cls", list(DOCUMENTED))
def test_body_names_the_class_and_carries_the_detail(cls: type[QStateError]) -> None:
    exc = sample(cls)
    body = exc.body()
    assert body["error"] == cls.__name__
    assert body["message"] == exc.message == str(exc)
    assert {k: v for k, v in body.items() if k not in ("error", "message")} == exc.detail


def test_constructors_keep_their_named_detail() -> None:
    u = Unavailable("down", retry_after_s=4.0)
    assert u.retry_after_s == 4.0 and u.detail == {"retry_after_s": 4.0}
    assert Unavailable("down").retry_after_s == 1.0
    b = BadRecord("no field 'n'", kind="missing")
    assert (b.reason, b.kind, b.message) == ("no field 'n'", "missing", "no field 'n'")
    assert b.body() == {"error": "BadRecord", "message": "no field 'n'", "kind": "missing"}


# ---- from_grpc ------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "cls"), [
    (Code.INVALID_ARGUMENT, InvalidRequest),
    (Code.NOT_FOUND, NotFound),
    (Code.ABORTED, StaleEpoch),
    (Code.FAILED_PRECONDITION, NotOwner),
    (Code.DATA_LOSS, DeltaMismatch),
])
def test_from_grpc_maps_codes_to_classes(code: grpc.StatusCode, cls: type[QStateError]) -> None:
    err = from_grpc(FakeRpcError(code, "shard says no"))
    assert type(err) is cls
    assert err is not None and err.message == "shard says no"
    assert err.grpc_code == code
    empty = from_grpc(FakeRpcError(code, ""))
    assert empty is not None and empty.message == cls.__name__  # no details: the class name


@pytest.mark.parametrize("code", [Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.CANCELLED,
                                  Code.INTERNAL, Code.UNKNOWN, Code.RESOURCE_EXHAUSTED])
def test_from_grpc_leaves_transport_failures_to_the_caller(code: grpc.StatusCode) -> None:
    assert from_grpc(FakeRpcError(code, "connection reset")) is None


# TooLarge and Overloaded are the router's own answers to its clients: no shard sends them
@pytest.mark.parametrize("cls", [c for c in DOCUMENTED
                                 if c.grpc_code not in (Code.UNAVAILABLE, Code.INTERNAL)
                                 and c not in (TooLarge, Overloaded)])
def test_an_error_crossing_grpc_keeps_its_status(cls: type[QStateError]) -> None:
    """What a shard raises comes back as its class or the base class of its code, so the
    router answers with the same HTTP status and a client sees the same kind of error."""
    exc = sample(cls)
    back = from_grpc(FakeRpcError(exc.grpc_code, exc.message))
    assert back is not None
    assert (back.http_status, back.grpc_code, back.message) == (
        exc.http_status, exc.grpc_code, exc.message)


@pytest.mark.parametrize("cls", list(DOCUMENTED))
def test_with_its_trailers_an_error_comes_back_as_itself(cls: type[QStateError]) -> None:
    """A process that aborts with ``grpc_trailers(exc)`` gets ``exc``'s class and detail
    back on the other side, subclass and all (InvalidAddress, Fenced, retry_after_s...)."""
    exc = sample(cls)
    back = from_grpc(FakeRpcError(exc.grpc_code, exc.message, grpc_trailers(exc)))
    assert type(back) is cls
    assert back is not None and (back.message, back.detail) == (exc.message, exc.detail)


def test_trailers_naming_a_class_of_another_code_are_ignored() -> None:
    forged = (("qstate-error", "StaleEpoch"), ("qstate-detail", "{}"))
    back = from_grpc(FakeRpcError(Code.NOT_FOUND, "gone", forged))
    assert type(back) is NotFound


# ---- from_http ------------------------------------------------------------------------

@pytest.mark.parametrize("cls", list(DOCUMENTED))
def test_from_http_rebuilds_the_class_with_its_detail(cls: type[QStateError]) -> None:
    exc = sample(cls)
    back = from_http(exc.http_status, exc.body())
    assert type(back) is cls
    assert back.message == exc.message
    assert back.detail == exc.detail
    assert back.body() == exc.body()


def test_from_http_unavailable_keeps_retry_after() -> None:
    back = from_http(503, {"error": "Unavailable", "message": "restoring",
                           "retry_after_s": 7.5, "partition": 12})
    assert isinstance(back, Unavailable)
    assert back.retry_after_s == 7.5
    assert back.detail == {"retry_after_s": 7.5, "partition": 12}


def test_from_http_not_found_keeps_batch_and_watermark() -> None:
    back = from_http(404, {"error": "NotFound", "message": "no data", "batch": 311,
                           "watermark": 17})
    assert type(back) is NotFound
    assert back.detail == {"batch": 311, "watermark": 17}


@pytest.mark.parametrize(("status", "cls"), [
    (400, InvalidRequest), (404, NotFound), (503, Unavailable), (409, StaleEpoch),
    (500, QStateError), (418, QStateError), (502, QStateError),
])
def test_from_http_falls_back_by_status(status: int, cls: type[QStateError]) -> None:
    for body in ({"error": "SomethingNew", "message": "m"}, {"message": "m"}):
        back = from_http(status, body)
        assert type(back) is cls
        assert back.message == "m"


def test_from_http_message_fallbacks() -> None:
    # FastAPI's own errors carry "detail" instead of "message"
    assert from_http(404, {"detail": "Not Found"}).message == "Not Found"
    empty = from_http(503, {})
    assert type(empty) is Unavailable and empty.message == "HTTP 503"


def test_from_http_body_with_fields_the_class_does_not_take() -> None:
    back = from_http(400, {"error": "BadRecord", "message": "bad", "kind": "type",
                           "unexpected": 1})
    assert type(back) is BadRecord
    assert back.message == "bad"


def test_every_class_name_resolves() -> None:
    # a client must be able to tell every class apart by the "error" of a body
    for cls in DOCUMENTED:
        body: dict[str, Any] = {"error": cls.__name__, "message": "x"}
        assert type(from_http(599, body)) is cls
