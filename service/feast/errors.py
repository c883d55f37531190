"""qstate's errors as Feast serves them: each class here is the qstate class of the same name
(``except qstate.errors.Unavailable`` catches it) and also a ``FeastError``, so that
``feast serve`` answers it with the qstate class's HTTP status and a body naming it
(``{"module", "class", "message"}``) instead of a bare 500 (docs/feast.md, errors).
"""

from __future__ import annotations

from typing import Any

from feast.errors import FeastError

from qstate.core.errors import QStateError, error_classes

__all__ = ["served"]

_SERVED: dict[type[QStateError], type[QStateError]] = {}


def _status(self: QStateError) -> int:
    return type(self).http_status


def _serving(cls: type[QStateError]) -> type[QStateError]:
    """``cls`` and FeastError, under ``cls``'s name, defined in this module (Feast's remote
    client finds a class by its module and name)."""
    made = _SERVED.get(cls)
    if made is None:
        made = type(cls.__name__, (cls, FeastError), {
            "__module__": __name__, "__qualname__": cls.__name__, "__doc__": cls.__doc__,
            "http_status_code": _status})
        _SERVED[cls] = made
        globals().setdefault(cls.__name__, made)
    return made


def served(exc: QStateError) -> QStateError:
    """``exc`` as the served class of its own: same message, detail and attributes."""
    if isinstance(exc, FeastError):
        return exc
    cls = _serving(type(exc))
    out: Any = cls.__new__(cls)
    out.__dict__.update(exc.__dict__)
    out.args = exc.args
    out.__cause__, out.__traceback__ = exc.__cause__, exc.__traceback__
    return out  # type: ignore[no-any-return]


# the classes a read or a check can raise, defined at import (so Feast's remote client finds
# them by name in this module); a class added to qstate.core.errors later is made on first use
for _cls in error_classes():
    _serving(_cls)
