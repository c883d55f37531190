from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qstate.core.address import InvalidAddress, check_key, check_name, partition_of

PINNED = [4, 12, 8]  # partition_of("", "a", "campaign-17") at P=64, as Spark 4.3 computes
FIXED = ["", "a", "campaign-17", "tw-123456", "ünïcødé ✓ 中文 🚀", "x" * 1024,
         "é" * 512, "key with spaces", "\x00nul"]


VECTORS = Path(__file__).parents[2] / "vectors" / "address.json"


@pytest.mark.spark
@pytest.mark.parametrize("partitions", [1, 7, 64, 4096])
def test_partition_of_equals_spark_pmod_xxhash64(spark, partitions: int) -> None:
    df = spark.createDataFrame([(k,) for k in FIXED], "k string")
    rows = df.selectExpr("k", f"pmod(xxhash64(k), {partitions}) AS p").collect()
    assert {r.k: r.p for r in rows} == {k: partition_of(k, partitions) for k in FIXED}


@pytest.mark.spark
def test_the_vectors_partitions_are_sparks(spark) -> None:
    """tests/vectors/address.json, which the engine's cargo test and the Python tests read,
    holds the partitions Spark computes."""
    cases = json.loads(VECTORS.read_text())["partitions"]
    keys = [c["key"] if isinstance(c["key"], str) else c["key"]["repeat"] * c["key"]["times"]
            + c["key"].get("then", "") for c in cases]
    df = spark.createDataFrame([(k, c["partitions"]) for k, c in zip(keys, cases, strict=True)],
                               "k string, n int")
    got = [r.p for r in df.selectExpr("pmod(xxhash64(k), n) AS p").collect()]
    assert got == [c["partition"] for c in cases]


@given(st.text(max_size=300), st.integers(min_value=1, max_value=5000))
def test_partition_is_in_range(key: str, partitions: int) -> None:
    assert 0 <= partition_of(key, partitions) < partitions


def test_known_values_do_not_drift() -> None:
    # a change of hash or seed fails here even without a JVM
    assert [partition_of(k, 64) for k in ("", "a", "campaign-17")] == PINNED



def test_names_and_keys_are_validated() -> None:
    assert check_name("job", "ads.v2_x-1") == "ads.v2_x-1"
    for bad in ("", "a/b", "x" * 65, "sp ace"):
        with pytest.raises(InvalidAddress, match="A-Z a-z 0-9"):
            check_name("job", bad)
    check_key("é" * 512)
    with pytest.raises(InvalidAddress, match="at most 1024"):
        check_key("é" * 513)


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-flag", "a/b", "", "x" * 65, "a b",
                                  "a\n", "ü"])
def test_names_that_could_escape_or_hide_a_folder_are_refused(name: str) -> None:
    with pytest.raises(InvalidAddress, match="A-Z a-z 0-9"):
        check_name("job", name)


@pytest.mark.parametrize("name", ["tweets", "per_tweet_1h", "v1.2", "a-b", "_x", "9", "x" * 64])
def test_names_of_the_documented_alphabet_pass(name: str) -> None:
    assert check_name("operator", name) == name
