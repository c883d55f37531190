"""Typed failures of a query, each with its HTTP status and gRPC code (DESIGN §5)."""

from __future__ import annotations

import grpc


class QueryError(Exception):
    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def body(self) -> dict:
        return {"error": type(self).__name__, "message": self.message, **self.detail}


class InvalidRequest(QueryError):
    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(QueryError):
    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class Unavailable(QueryError):
    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, retry_after_s: float = 1.0, **detail: object) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **detail)
        self.retry_after_s = retry_after_s
