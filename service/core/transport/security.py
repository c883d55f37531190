"""How qstate's servers and callers secure their sockets: TLS from settings, the cluster token
of the internal shard API, and the rule that plain text and open doors stay on loopback.

The shard API (Commit, MultiGet, Describe) is internal: a shard server with a
``cluster_token`` answers only calls that carry ``authorization: Bearer <cluster token>`` in
their metadata, and every caller made here sends it. TLS (``tls_cert``/``tls_key`` on a
server, ``tls_ca`` on its callers) encrypts the same sockets. A server bound to an address
other than loopback refuses to start without them unless ``allow_insecure`` says a mesh does
that job (``check_exposure``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from qstate.core.config import Settings
from qstate.core.errors import InvalidRequest, StartFailed
from qstate.core.transport.files import write_file

__all__ = ["AUTH_HEADER", "NO_REUSEPORT", "aio_channel", "bearer", "channel", "check_exposure",
           "clean_token", "cluster_interceptors", "cluster_token", "host_token", "host_token_path",
           "is_loopback", "server_port", "shard_settings"]

log = logging.getLogger(__name__)

# the standard health service's methods (qstate.core.transport.grpc_health): a shard answers them
# without the cluster token, as a probe sends none. Spelled out: a reader's install (this
# module, without grpcio-health-checking) must import.
HEALTH_PREFIX = "/grpc.health.v1.Health/"

AUTH_HEADER = "authorization"  # gRPC metadata keys are lower case


_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # what an HTTP header or gRPC metadata can carry


def clean_token(token: str, what: str) -> str:
    """``token`` without surrounding white space (a secret read from a file ends in a line
    break); fails, without quoting it, when it holds a character no header can carry."""
    token = token.strip()
    if token and not _TOKEN_CHARS.fullmatch(token):
        raise InvalidRequest(f"{what} holds a space, a control or a non-ASCII character, which "
                             "no header can carry (the token itself is not shown)")
    return token


HOST_TOKEN = "cluster-token"  # under <home>: the token shards on this host made or share


def host_token_path(home: str | Path) -> Path:
    """Where a shard on loopback without a configured token keeps the one it made, and where
    every job, router and tool with the same ``home`` finds it (docs/architecture.md §7)."""
    return Path(home) / HOST_TOKEN


def cluster_token(cfg: Settings) -> str:
    """The cluster token: ``cluster_token``, else the content of ``cluster_token_file`` (a
    mounted secret), else the host's token in ``<home>/cluster-token`` when one exists (made
    by a shard or by ``qstate run``), else empty."""
    if cfg.cluster_token:
        return clean_token(cfg.cluster_token, "QSTATE_CLUSTER_TOKEN")
    if cfg.cluster_token_file:
        return _token_file(Path(cfg.cluster_token_file))
    host = host_token_path(cfg.home)
    return _token_file(host) if host.exists() else ""


def _token_file(path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not text"
        raise StartFailed(f"cluster token file {path}: {why}") from None
    return clean_token(text, f"cluster token file {path}")


def host_token(home: str | Path) -> str:
    """The host's token in ``<home>/cluster-token``: the one there, else a new random one
    written there (mode 0600 from its first byte). Made by a link of a complete file, so
    shards starting at once on one host agree on one token and none reads half of one."""
    path = host_token_path(home)
    if path.exists():
        return _token_file(path)
    draft = path.with_name(f".{HOST_TOKEN}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(draft, secrets.token_urlsafe(32).encode(), secret=True)
        os.link(draft, path)
        log.warning("no cluster token configured: made one in %s (mode 0600); jobs, routers "
                    "and tools with the same QSTATE_HOME read it there. Set "
                    "QSTATE_CLUSTER_TOKEN or QSTATE_CLUSTER_TOKEN_FILE on every process of a "
                    "deployment that spans hosts", path.resolve())
    except FileExistsError:
        pass  # another shard made it meanwhile: theirs is the host's
    except OSError as exc:
        raise StartFailed(f"cannot make the cluster token {path}: {exc.strerror}; set "
                          "QSTATE_CLUSTER_TOKEN or QSTATE_CLUSTER_TOKEN_FILE, or a writable "
                          "QSTATE_HOME") from None
    finally:
        draft.unlink(missing_ok=True)
    return _token_file(path)


def shard_settings(cfg: Settings, host: str) -> Settings:
    """A shard server's settings with its cluster token resolved: a shard never runs open.
    Without a configured token it uses the host's (``host_token``) on a loopback address;
    elsewhere ``check_exposure`` refuses, unless ``allow_insecure`` says a mesh
    authenticates, and only there does the shard API answer without a token."""
    token = cluster_token(cfg)
    if not token and is_loopback(host):
        token = host_token(cfg.home)
    # off loopback without a token: refused, or (allow_insecure) allowed with a warning
    check_exposure(host, cfg.model_copy(update={"cluster_token": token}), "the shard API")
    return cfg.model_copy(update={"cluster_token": token, "cluster_token_file": ""})


def bearer(header: str | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` value, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to them (``localhost``)."""
    h = host.strip("[]")
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_exposure(host: str, cfg: Settings, role: str, *, tokens: bool = False) -> None:
    """Refuse to serve ``role`` on a non-loopback ``host`` in plain text or with open doors:
    no TLS, no cluster token (shards), no client tokens (routers, ``tokens=True``). The
    message names every missing setting; ``allow_insecure`` turns the refusal into a
    warning."""
    if is_loopback(host):
        return
    missing = []
    if not (cfg.tls_cert and cfg.tls_key):
        missing.append("TLS (QSTATE_TLS_CERT and QSTATE_TLS_KEY; `qstate certs` makes them)")
    if not cluster_token(cfg):
        missing.append("the cluster token (QSTATE_CLUSTER_TOKEN or QSTATE_CLUSTER_TOKEN_FILE)")
    if tokens and not cfg.tokens_file:
        missing.append("client tokens (QSTATE_TOKENS_FILE; `qstate token add` makes them)")
    if not missing:
        return
    what = f"{role} on {host} (not a loopback address) without " + ", ".join(missing)
    if cfg.allow_insecure:
        log.warning("%s: allowed by QSTATE_ALLOW_INSECURE", what)
        return
    raise StartFailed(f"refusing to serve {what}; set them, bind 127.0.0.1, or set "
                      "QSTATE_ALLOW_INSECURE=true where a mesh encrypts and authenticates")


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise StartFailed(f"cannot read {what} {path}: {exc.strerror}") from None


# grpc binds with SO_REUSEPORT unless told not to: a second server on a port in use would
# start without a word and take part of its traffic (a shard of an earlier run taking
# commits). Every qstate gRPC server is built with this option, so a port in use is an error.
NO_REUSEPORT = ("grpc.so_reuseport", 0)


def server_port(server: grpc.aio.Server, address: str, cfg: Settings) -> int:
    """Add ``address`` to ``server`` (built with ``NO_REUSEPORT``): TLS with
    ``tls_cert``/``tls_key`` when set, plain text otherwise. The bound port; StartFailed
    when the address is in use or not this host's."""
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise StartFailed("TLS needs both QSTATE_TLS_CERT and QSTATE_TLS_KEY")
    try:
        if not cfg.tls_cert:
            return server.add_insecure_port(address)
        creds = grpc.ssl_server_credentials(
            [(_read(cfg.tls_key, "TLS key"), _read(cfg.tls_cert, "TLS certificate"))])
        return server.add_secure_port(address, creds)
    except RuntimeError:  # grpc says only "Failed to bind"
        raise StartFailed(f"cannot listen on {address}: the port is in use (another server "
                          "there?) or the address is not this host's") from None


def _channel_credentials(cfg: Settings) -> grpc.ChannelCredentials | None:
    if not cfg.tls_ca:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_read(cfg.tls_ca, "TLS CA bundle"))


class _Metadata(grpc.UnaryUnaryClientInterceptor):
    """Sends the cluster token with every call of a blocking channel."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                              request: Any) -> Any:
        md = tuple(details.metadata or ()) + self.pairs
        return continuation(details._replace(metadata=md), request)


class _AioMetadata(grpc.aio.UnaryUnaryClientInterceptor):
    """Sends the cluster token with every call of an asyncio channel."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self.pairs = pairs

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                                    request: Any) -> Any:
        md = grpc.aio.Metadata(*(tuple(details.metadata or ()) + self.pairs))
        return await continuation(details._replace(metadata=md), request)


def _token_pairs(cfg: Settings) -> tuple[tuple[str, str], ...]:
    token = cluster_token(cfg)
    return ((AUTH_HEADER, f"Bearer {token}"),) if token else ()


def _named(options: list[tuple[str, Any]], cfg: Settings) -> list[tuple[str, Any]]:
    """Shards register an address (a pod IP) that no shared certificate names: with
    ``tls_server_name`` set, that name is what the certificate is checked against."""
    if not cfg.tls_server_name:
        return options
    return [*options, ("grpc.ssl_target_name_override", cfg.tls_server_name)]


def channel(address: str, cfg: Settings, options: list[tuple[str, Any]]) -> grpc.Channel:
    """A blocking channel to a shard server: TLS when ``tls_ca`` is set, the cluster token
    on every call when set."""
    creds = _channel_credentials(cfg)
    ch = grpc.secure_channel(address, creds, options=_named(options, cfg)) \
        if creds is not None else grpc.insecure_channel(address, options=options)
    pairs = _token_pairs(cfg)
    return grpc.intercept_channel(ch, _Metadata(pairs)) if pairs else ch


def aio_channel(address: str, cfg: Settings, options: list[tuple[str, Any]]
                ) -> grpc.aio.Channel:
    """``channel`` for asyncio callers (the router)."""
    creds = _channel_credentials(cfg)
    pairs = _token_pairs(cfg)
    interceptors = [_AioMetadata(pairs)] if pairs else None
    if creds is not None:
        return grpc.aio.secure_channel(address, creds, options=_named(options, cfg),
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


class _ClusterTokenCheck(grpc.aio.ServerInterceptor):
    """Refuses every call that lacks the cluster token, before the servicer runs. Compared
    in constant time; what a caller sent is never repeated or logged."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}".encode()

        async def refuse(_: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "the internal shard API needs the cluster token "
                                "(QSTATE_CLUSTER_TOKEN): missing or wrong",
                                (("qstate-error", "Unauthenticated"),))

        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method.startswith(HEALTH_PREFIX):  # type: ignore[attr-defined]
            return await continuation(details)  # probes send no token; health tells nothing
        sent = dict(details.invocation_metadata or ()).get(AUTH_HEADER, "")  # type: ignore[attr-defined]
        sent_b = sent.encode() if isinstance(sent, str) else bytes(sent)
        if hmac.compare_digest(sent_b, self.expected):
            return await continuation(details)
        return self._refusal


def cluster_interceptors(cfg: Settings) -> list[grpc.aio.ServerInterceptor]:
    """The shard server's interceptors: the cluster token check when one is set."""
    token = cluster_token(cfg)
    return [_ClusterTokenCheck(token)] if token else []
