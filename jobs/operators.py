"""A queryable operator as a job declares it: the aggregation plus what serve() needs."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

from service.operator import WindowSpec


@dataclass(frozen=True)
class QueryableOperator:
    name: str
    frame: DataFrame  # streaming aggregation in update mode
    key: str
    states: list[str]
    window: WindowSpec
