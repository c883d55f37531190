"""Every error class qstate raises, importable from one place: ``from qstate.errors import
NotFound``. They are defined with their HTTP status and gRPC code in ``qstate.core.errors``;
this is their public name."""

from qstate.core.errors import (
    BadRecord,
    BrokerError,
    CommitFailed,
    CorruptState,
    DeltaMismatch,
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
)

__all__ = [
    "BadRecord",
    "BrokerError",
    "CommitFailed",
    "CorruptState",
    "DeltaMismatch",
    "Fenced",
    "Forbidden",
    "InvalidAddress",
    "InvalidRequest",
    "NotFound",
    "NotOwner",
    "Overloaded",
    "QStateError",
    "StaleEpoch",
    "StartFailed",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "UnknownOperator",
]
