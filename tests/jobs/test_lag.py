"""Events behind, from Spark's progress of a Kafka source (unit: a stand-in for the query;
the exactness tests check it is 0 on a real query that read everything)."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
from prometheus_client import REGISTRY

from qstate.jobs.runtime.launch import RunningJob


def _query(latest: dict | None, end: dict | None) -> SimpleNamespace:
    source = SimpleNamespace(latestOffset=orjson.dumps(latest).decode(),
                             endOffset=orjson.dumps(end).decode() if end is not None else None)
    return SimpleNamespace(lastProgress=SimpleNamespace(sources=[source]))


def _job(*queries: SimpleNamespace) -> RunningJob:
    job = RunningJob.__new__(RunningJob)
    job.job = SimpleNamespace(name="lagtest")  # type: ignore[assignment]
    job.queries = {f"q{i}": q for i, q in enumerate(queries)}  # type: ignore[misc]
    return job


def test_events_behind_sum_over_partitions_and_go_to_the_metric() -> None:
    job = _job(_query({"t": {"0": 10, "1": 5, "2": 7}}, {"t": {"0": 4, "1": 5, "2": 1}}))
    assert job.behind() == {"t": 12}
    assert REGISTRY.get_sample_value("qstate_job_lag_events",
                                     {"job": "lagtest", "topic": "t"}) == 12


def test_a_partition_not_read_yet_counts_nothing_and_queries_of_one_topic_take_the_max(
        ) -> None:
    # a partition missing from the end offsets (new) is not counted as behind
    job = _job(_query({"t": {"0": 10, "1": 3}}, {"t": {"0": 10}}),
               _query({"t": {"0": 10, "1": 3}}, {"t": {"0": 2, "1": 3}}))
    assert job.behind() == {"t": 8}


def test_the_broker_s_end_offsets_count_so_a_stalled_job_falls_behind() -> None:
    # the last batch planned with latest = end: Spark's progress alone says 0 behind
    q = _query({"t": {"0": 10, "1": 5}}, {"t": {"0": 10, "1": 5}})
    job = _job(q)
    assert job.behind() == {"t": 0}
    ends = {"0": 10, "1": 5}
    job.end_offsets = lambda topic: dict(ends) if topic == "t" else None
    for produced in (100, 200):  # no new batch while events keep coming
        ends["0"] = 10 + produced
        assert job.behind() == {"t": produced}
    job.end_offsets = lambda topic: None  # broker not answering: Spark's latest stands in
    assert job.behind() == {"t": 0}


def test_no_progress_yet_is_nothing_behind_known() -> None:
    assert _job(SimpleNamespace(lastProgress=None)).behind() == {}
    # what Spark reports before its source has seen the topic
    assert _job(_query(None, None)).behind() == {}
