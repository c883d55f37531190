"""Feast's online store over qstate: ``get_online_features`` and ``feast serve`` answer a
streaming job's live window aggregates, read from its state (docs/feast.md).

    online_store:
      type: qstate.feast.QStateOnlineStore

Needs ``pip install 'qstate[feast]'`` (Feast, pinned below its next minor version); nothing
else in qstate imports it.
"""

from __future__ import annotations

from qstate.feast.store import QStateOnlineStore, QStateOnlineStoreConfig

__all__ = ["QStateOnlineStore", "QStateOnlineStoreConfig"]
