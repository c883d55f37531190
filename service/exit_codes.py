"""The exit codes of every command that queries a router: ``qstate get``, ``qstate top``,
``qstate watch`` and the Node client (``clients/node/query.mjs``), one table for all.
The Node client keeps a copy of it, which its tests check against this one."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the errors import grpc: loaded when a command fails, not at its start
    from qstate.core.errors import QStateError

__all__ = ["HELP", "Exit", "exit_code"]


class Exit(IntEnum):
    OK = 0
    NOT_FOUND = 1  # no data for the key, or an unknown job/operator/state (404, NOT_FOUND)
    BAD_REQUEST = 2  # refused as asked (400, 413, INVALID_ARGUMENT), or the command line
    UNAVAILABLE = 3  # after retries: 503, 429 (UNAVAILABLE, RESOURCE_EXHAUSTED)
    UNREACHABLE = 4  # no router answers at the address
    NOT_ALLOWED = 5  # no valid token, or one that may not read this (401, 403)
    OTHER = 6  # anything else the router answers (500, INTERNAL, ...)


HELP = ("Exit codes: 0 ok; 1 no data for the key, or an unknown job, operator or state; 2 a "
        "bad request or command line; 3 a partition unavailable or the router overloaded, "
        "after retries; 4 the router cannot be reached; 5 no valid token, or one that may "
        "not read this job; 6 any other error of the router.")


def exit_code(exc: QStateError) -> Exit:
    """The exit code of a command that ends with ``exc`` from the router."""
    from qstate.core.errors import (
        Forbidden,
        InvalidRequest,
        NotFound,
        Overloaded,
        Unauthenticated,
        Unavailable,
    )

    for cls, code in ((NotFound, Exit.NOT_FOUND), (InvalidRequest, Exit.BAD_REQUEST),
                      (Unavailable, Exit.UNAVAILABLE), (Overloaded, Exit.UNAVAILABLE),
                      (Unauthenticated, Exit.NOT_ALLOWED), (Forbidden, Exit.NOT_ALLOWED)):
        if isinstance(exc, cls):
            return code
    return Exit.OTHER
