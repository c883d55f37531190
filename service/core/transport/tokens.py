"""Client tokens of the router: the file that stores them (hashed), and what a token may read.

The file (``QSTATE_TOKENS_FILE``, written by ``qstate token add``)::

    {"tokens": [{"name": "grafana", "sha256": "<hex>",
                 "scopes": ["tweets", "ads/per_campaign_10s"]}]}

A scope ``job`` reads every operator of the job, ``job/operator`` that operator, ``*``
everything, the cluster view included. Only the SHA-256 of a token is stored: tokens are 256
random bits, so a fast hash is as safe as a slow one and costs nothing per request. A token is
named in messages by its ``name``; the token itself is never logged, repeated or kept.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from qstate.core.address import NAME_PATTERN
from qstate.core.errors import Forbidden, InvalidRequest, StartFailed, Unauthenticated
from qstate.core.transport.files import write_file

__all__ = ["ALL", "Principal", "TokenBook", "TokenEntry", "WatchedTokens", "add_token",
           "hash_token"]

log = logging.getLogger(__name__)

ALL = "*"
_SCOPE = rf"^(\*|{NAME_PATTERN.strip('^$')}(/{NAME_PATTERN.strip('^$')})?)$"


class TokenEntry(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    scopes: list[str] = Field(min_length=1)

    model_config = {"extra": "forbid"}


class TokenFile(BaseModel):
    tokens: list[TokenEntry] = Field(default_factory=list)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_scope(scope: str) -> str:
    if not re.fullmatch(_SCOPE, scope):
        raise InvalidRequest(f"scope {scope!r}: expected JOB, JOB/OPERATOR or *")
    return scope


@dataclass(frozen=True)
class Principal:
    """Who a valid token belongs to and what it may read."""

    name: str
    scopes: frozenset[str]

    def allows(self, job: str, operator: str | None = None) -> bool:
        """May read ``job`` (every operator when ``operator`` is None, e.g. a job's
        description lists them: then any scope inside the job is enough)."""
        if ALL in self.scopes or job in self.scopes:
            return True
        if operator is None:
            return any(s.startswith(f"{job}/") for s in self.scopes)
        return f"{job}/{operator}" in self.scopes

    def check(self, job: str, operator: str | None = None) -> None:
        if not self.allows(job, operator):
            asked = job if operator is None else f"{job}/{operator}"
            raise Forbidden(f"token {self.name!r} may read {', '.join(sorted(self.scopes))}; "
                            f"not {asked}")

    def check_all(self, what: str) -> None:
        if ALL not in self.scopes:
            raise Forbidden(f"token {self.name!r} may read {', '.join(sorted(self.scopes))}; "
                            f"{what} needs a token with scope *")


class TokenBook:
    """The tokens a router accepts, by hash."""

    def __init__(self, entries: list[TokenEntry]) -> None:
        self._by_hash = {e.sha256: Principal(e.name, frozenset(e.scopes)) for e in entries}

    def entries(self) -> list[tuple[str, str, list[str]]]:
        """Each token's hash, name and scopes (what the read engine checks tokens with)."""
        return [(h, p.name, sorted(p.scopes)) for h, p in self._by_hash.items()]

    @staticmethod
    def read(path: str | Path) -> TokenFile:
        """The tokens file; a missing or malformed one fails naming it."""
        try:
            f = TokenFile.model_validate_json(Path(path).read_bytes())
            for e in f.tokens:
                for s in e.scopes:
                    check_scope(s)
        except OSError as exc:
            raise StartFailed(f"tokens file {path}: {exc.strerror}") from None
        except (ValidationError, InvalidRequest) as exc:
            raise StartFailed(f"tokens file {path} is not valid: {exc}") from None
        names = [e.name for e in f.tokens]
        if len(names) != len(set(names)):
            raise StartFailed(f"tokens file {path} names a token twice")
        return f

    @classmethod
    def load(cls, path: str | Path) -> TokenBook:
        return cls(cls.read(path).tokens)

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("a token is needed: send Authorization: Bearer <token> "
                                  "(gRPC: metadata authorization)")
        digest = hash_token(token)
        for known, principal in self._by_hash.items():
            # every stored hash compared, in constant time: no timing tells how close it was
            if hmac.compare_digest(known, digest):
                return principal
        raise Unauthenticated("the token is not valid (unknown, revoked or mistyped)")


def add_token(path: Path, name: str, scopes: list[str]) -> str:
    """A new token for ``name`` with ``scopes``: its hash appended to ``path`` (created
    0600), the token returned, to be shown once."""
    entry = TokenEntry(name=name, sha256="0" * 64, scopes=[check_scope(s) for s in scopes])
    current = TokenBook.read(path) if path.exists() else TokenFile()
    if any(e.name == name for e in current.tokens):
        raise InvalidRequest(f"a token named {name!r} exists in {path}")
    token = "qs_" + secrets.token_urlsafe(32)
    current.tokens.append(entry.model_copy(update={"sha256": hash_token(token)}))
    path.parent.mkdir(parents=True, exist_ok=True)
    # written aside and renamed over: a router watching the file never reads half of it
    tmp = path.with_suffix(path.suffix + ".tmp")
    write_file(tmp, json.dumps(current.model_dump(), indent=2).encode(), secret=True)
    os.replace(tmp, path)
    return token


class WatchedTokens:
    """The book of a tokens file, re-read when the file changes (checked at most once a
    ``every_s``): a token removed from the file is refused within a second, no restart. A
    file deleted revokes every token; a file that becomes invalid keeps the last good book,
    said once per change of the file."""

    def __init__(self, path: str | Path, every_s: float = 1.0) -> None:
        self.path = Path(path)
        self.every_s = every_s
        self._book = TokenBook.load(self.path)  # invalid at start: the router does not start
        self._seen = self._stamp()
        self._checked = time.monotonic()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def book(self) -> TokenBook:
        now = time.monotonic()
        if now - self._checked < self.every_s:
            return self._book
        self._checked = now
        try:
            stamp = self._stamp()
            if stamp == self._seen:
                return self._book
            self._seen = stamp
            if stamp is None:
                self._book = TokenBook([])
                log.warning("tokens file %s is gone: every token is refused", self.path)
            else:
                self._book = TokenBook.load(self.path)
                log.warning("tokens file %s re-read", self.path)
        except (OSError, StartFailed) as exc:
            log.error("tokens file %s: keeping the tokens read before: %s", self.path, exc)
        return self._book

    def authenticate(self, token: str | None) -> Principal:
        return self.book().authenticate(token)
