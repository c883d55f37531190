"""The embedded broker's cluster ids: never one the format tool would read as an option."""

from __future__ import annotations

import base64
import uuid
from unittest import mock

from qstate.embedded.kafka import cluster_id


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    # the first UUID drawn would encode to "-..." (0xf8 >> 2 = 62, "-" in URL-safe base64)
    dashed = uuid.UUID(bytes=b"\xf8" + b"\x00" * 15)
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    with mock.patch("qstate.embedded.kafka.uuid.uuid4", side_effect=[dashed, uuid.UUID(int=1)]):
        cid = cluster_id()
    assert not cid.startswith("-") and len(cid) == 22
    assert base64.urlsafe_b64decode(cid + "==") == uuid.UUID(int=1).bytes
