"""Client tokens at the router's doors: who is asking (``WatchedTokens``) and whether their
token's scopes cover the job and operator asked for, before any lookup.

HTTP: an ASGI wrapper outside both the fast path and FastAPI, so no route can forget it;
the request's ``Principal`` is left in ``scope["state"]["principal"]`` (FastAPI's
``request.state.principal``) for routes that filter (the job list). gRPC:
``GrpcAuth.principal`` from the call's metadata. Open without a
token: /healthz, /readyz, the API's documents (/docs, /openapi.json) and the /ui page's
files (they hold no data; the page sends the token the user gives it), and /metrics while
``metrics_public``. Without a tokens file everything is open, as on a laptop.
"""

from __future__ import annotations

from typing import Any

import grpc

from qstate.core.errors import QStateError
from qstate.core.transport.security import AUTH_HEADER, bearer
from qstate.core.transport.tokens import Principal, WatchedTokens
from qstate.router.wire import send_error

__all__ = ["PRINCIPAL_HEADER", "GrpcAuth", "target_of", "with_auth"]

# how the native front hands Python the principal it let a request in with (its twin:
# engine/core/src/front.rs)
PRINCIPAL_HEADER = b"x-qstate-principal"

_OPEN = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc",
                   "/openapi.json", "/favicon.ico"})


def _open(path: str, metrics_public: bool) -> bool:
    return path in _OPEN or path == "/ui" or path.startswith("/ui/") or \
        (metrics_public and path == "/metrics")


_BATCH = ":batchGet"


def target_of(path: str) -> tuple[str, str | None] | None:
    """The job and operator a data path asks for: /v1/state|series|top|watch/{job}/{op}/...,
    /v1/state/{job}/{op}:batchGet, or /v1/jobs/{job}[/position] (operator None); None for
    paths that name no job."""
    parts = path.split("/", 5)
    if len(parts) == 5 and parts[1:3] == ["v1", "state"] and parts[4].endswith(_BATCH):
        return parts[3], parts[4].removesuffix(_BATCH)  # several states of one operator
    if len(parts) >= 5 and parts[1] == "v1" and parts[2] in ("state", "series", "top", "watch"):
        return parts[3], parts[4]
    if len(parts) in (4, 5) and parts[1] == "v1" and parts[2] == "jobs" and parts[3] and \
            parts[4:] in ([], ["position"]):
        return parts[3], None
    return None


def _authorize(book: WatchedTokens, scope: dict[str, Any]) -> Principal:
    header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"),
                  None)
    principal = book.authenticate(bearer(header))
    path = scope["path"]
    target = target_of(path)
    if target is not None:
        principal.check(*target)
    elif path == "/v1/cluster":
        principal.check_all("the cluster view (every job's partitions)")
    elif path not in ("/v1/jobs", "/metrics"):
        # The job list is filtered by its route, and /metrics (when not public) takes any
        # valid token: it holds no key or value. Any other path, e.g. a route added later
        # that does not say which job it reads, stays closed to scoped tokens until this
        # module learns its job.
        principal.check_all(path[:100])
    return principal


def _forwarded(scope: dict[str, Any]) -> Principal | None:
    """The principal the native front let the request in with (``PRINCIPAL_HEADER``: the
    front removes it from every request it is sent, so no outside request carries one)."""
    raw = next((v for k, v in scope["headers"] if k == PRINCIPAL_HEADER), None)
    if raw is None:
        return None
    name, _, scopes = raw.decode("latin-1").partition(" ")
    return Principal(name, frozenset(scopes.split(",")))


def with_auth(app: Any, book: WatchedTokens | None, metrics_public: bool = True,
              forwarded: bool = False) -> Any:
    """``forwarded``: the app behind the native front, which authenticated the request and
    sends its principal along (docs/architecture.md §5, native front); a request it could
    not read the path of comes without one and is authenticated here."""
    if book is None:
        return app

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _open(scope["path"], metrics_public):
            return await app(scope, receive, send)
        principal = _forwarded(scope) if forwarded else None
        try:
            if principal is None:
                principal = _authorize(book, scope)
        except QStateError as exc:
            return await send_error(send, exc)
        scope.setdefault("state", {})["principal"] = principal
        return await app(scope, receive, send)

    return asgi


class GrpcAuth:
    """The same check for the public gRPC API: the token in metadata ``authorization``."""

    def __init__(self, book: WatchedTokens | None) -> None:
        self.book = book

    def principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        """The caller, or None when the router asks for no tokens; raises
        ``Unauthenticated``."""
        if self.book is None:
            return None
        md = dict(context.invocation_metadata() or ())
        sent = md.get(AUTH_HEADER)
        return self.book.authenticate(bearer(sent if isinstance(sent, str) else None))

    def check(self, context: grpc.aio.ServicerContext, job: str,
              operator: str | None = None) -> None:
        p = self.principal(context)
        if p is not None:
            p.check(job, operator)
