"""How one feature view maps to qstate: ``online_store.feature_views`` of a Feast repository's
``feature_store.yaml`` (``QStateOnlineStoreConfig``, in ``qstate.feast.store``; docs/feast.md).

    online_store:
      type: qstate.feast.QStateOnlineStore
      url: https://router.example:8000      # else QSTATE_ROUTER_URL
      token_file: /run/secrets/qstate-token  # or token:, else QSTATE_TOKEN(_FILE)
      ca: certs/ca.pem                       # else QSTATE_TLS_CA
      feature_views:
        tweet_stats:                         # a feature view's name
          job: tweets
          operator: per_tweet_1h
          window: latest                     # or closed
          states: {views: impressions}       # feature -> state; others: the same name
"""

from __future__ import annotations

from typing import Literal

from feast.repo_config import FeastConfigBaseModel
from pydantic import Field, StrictStr

__all__ = ["ViewSource", "WindowChoice"]

# latest: the key's newest window (open or not). closed: the newest window of the operator's
# window grid whose end is at or before the answer's watermark (final: no event can change
# it), the same window for every key; docs/feast.md, windows.
WindowChoice = Literal["latest", "closed"]


class ViewSource(FeastConfigBaseModel):
    """Where one feature view's features live in qstate."""

    job: StrictStr = Field(description="The streaming job (GET /v1/jobs)")
    operator: StrictStr = Field(description="One aggregation of the job")
    window: WindowChoice = Field("latest", description="Which window a feature reads")
    states: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Feature name -> state name, for features whose "
        "name is not their state's")

    def state_of(self, feature: str) -> str:
        return self.states.get(feature, feature)
