"""Every error class qstate raises, importable from one place: ``from qstate.errors import
NotFound``. They are defined with their HTTP status and gRPC code in ``qstate.core.errors``;
this is their public name. Nothing is listed here: a class added there is exported here."""

from qstate.core import errors as _core
from qstate.core.errors import *  # noqa: F403  # what type checkers see: every class

__all__ = [c.__name__ for c in _core.error_classes() if c.__module__ == _core.__name__]
