"""The Yahoo Streaming Benchmark: views per campaign per 10 s tumbling window.

Events on ``ad-events``: ``{"user_id","page_id","ad_id","ad_type","event_type",
"event_time","ip_address"}`` (event_time epoch ms). Only ``view`` events count; ``ad_id``
maps to ``campaign_id`` through the mapping generated with the data. Watermark 10 s.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.operators import QueryableOperator
from service.operator import WindowSpec

JOB = "ads"
TOPIC = "ad-events"
FIELDS = {"user_id": "string", "page_id": "string", "ad_id": "string", "ad_type": "string",
          "event_type": "string", "event_time": "long", "ip_address": "string"}
WATERMARK = "10 seconds"


def load_mapping(path: Path) -> dict[str, str]:
    if not path.exists():
        raise FileNotFoundError(
            f"campaign mapping {path} not found: `qstate generate ads --mapping {path}` "
            "writes it together with the events")
    return orjson.loads(path.read_bytes())


def operators(events: DataFrame, mapping: dict[str, str]) -> list[QueryableOperator]:
    spark = events.sparkSession
    campaigns = spark.createDataFrame(sorted(mapping.items()), "ad_id string, campaign_id string")
    views = (events.where(F.col("event_type") == "view")
             .withColumn("ts", F.timestamp_millis("event_time"))
             .withWatermark("ts", WATERMARK)
             .join(F.broadcast(campaigns), "ad_id"))
    counts = views.groupBy(F.window("ts", "10 seconds"), F.col("campaign_id")).agg(
        F.count(F.lit(1)).alias("views"))
    return [QueryableOperator("campaign_views_10s", counts, "campaign_id", ["views"],
                              WindowSpec("tumbling", 10_000))]
