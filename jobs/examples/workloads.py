"""Seeded event generators for the two load-test workloads; pure Python, no Kafka.

Every event is a plain dict holding exactly the fields of its workload's wire format (see
``TWEET_FIELDS`` / ``AD_FIELDS``), so what tests feed the pipeline is what production sends.

Two clocks:

* ``events_over_span`` spreads events over a fixed event-time span and is fully determined
  by the seeds, for tests and reproducible benchmarks;
* ``live_events`` stamps wall-clock time, for ``qstate generate``.

Both can be disordered by at most ``disorder_ms``: an event's time is never more than that
behind the newest time emitted before it. ``with_late`` / ``late_events`` add events that lie
a chosen distance behind, to exercise the watermark.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from qstate.core.config import settings
from qstate.core.errors import InvalidRequest

__all__ = [
    "AD_EVENT_TYPES",
    "AD_FIELDS",
    "AD_TYPES",
    "TWEET_EVENTS",
    "TWEET_FIELDS",
    "WORKLOAD_NAMES",
    "Ads",
    "KeySampler",
    "Tweets",
    "Workload",
    "campaign_mapping",
    "default_mapping_path",
    "events_over_span",
    "late_events",
    "live_events",
    "load_mapping",
    "make_workload",
    "max_disorder",
    "span_times",
    "with_late",
    "write_mapping",
]

Event = dict[str, Any]
Distribution = Literal["uniform", "zipf"]

TWEET_FIELDS = ("tweet_id", "event", "time")
TWEET_EVENTS = ("impression", "url-click")

AD_FIELDS = ("user_id", "page_id", "ad_id", "ad_type", "event_type", "event_time", "ip_address")
AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
AD_EVENT_TYPES = ("view", "click", "purchase")

WORKLOAD_NAMES = ("tweets", "ads")


class KeySampler:
    """Draws indexes in ``[0, n)``: uniformly, or zipf-like (index i has weight 1/(i+1)^s)."""

    def __init__(
        self, n: int, rng: random.Random, distribution: Distribution = "uniform", s: float = 1.1
    ) -> None:
        if n < 1:
            raise ValueError(f"need at least one key, got {n}")
        if distribution not in ("uniform", "zipf"):
            raise ValueError(f"unknown key distribution {distribution!r}")
        self.n = n
        self._rng = rng
        self._cum: list[float] | None = None
        if distribution == "zipf":
            # A cumulative table + bisect is O(log n) per draw and exact for any s > 0, unlike
            # numpy's zipf which needs s > 1 and draws from an unbounded support.
            self._cum = list(itertools.accumulate((i + 1) ** -s for i in range(n)))

    def __call__(self) -> int:
        if self._cum is None:
            return self._rng.randrange(self.n)
        i = bisect.bisect_right(self._cum, self._rng.random() * self._cum[-1])
        return min(i, self.n - 1)  # float rounding at the top end


_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def _uuid(rng: random.Random) -> str:
    """A version-4 UUID string drawn from ``rng``; what ``str(uuid.UUID(int=..., version=4))``
    gives, at a third of the cost (ads mappings hold a million of them)."""
    h = f"{(rng.getrandbits(128) & _UUID4_CLEAR) | _UUID4_SET:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Workload(ABC):
    """A source of events of one wire format; ``event(t)`` makes the next one at time ``t``."""

    name: str
    key_field: str
    time_field: str
    fields: tuple[str, ...]
    default_topic: str

    @abstractmethod
    def event(self, time_ms: int) -> Event: ...

    def key_of(self, event: Event) -> str:
        return str(event[self.key_field])


class Tweets(Workload):
    """``{"tweet_id": "tw-N", "event": "impression"|"url-click", "time": epoch_ms}``."""

    name = "tweets"
    key_field = "tweet_id"
    time_field = "time"
    fields = TWEET_FIELDS
    default_topic = "tweet-events"

    def __init__(
        self,
        keys: int = 100_000,
        *,
        seed: int = 0,
        click_fraction: float = 0.1,
        distribution: Distribution = "uniform",
        zipf_s: float = 1.1,
    ) -> None:
        if not 0.0 <= click_fraction <= 1.0:
            raise ValueError(f"click_fraction must be in [0, 1], got {click_fraction}")
        self.keys = keys
        self.click_fraction = click_fraction
        self._rng = random.Random(f"tweets:{seed}")
        self._key = KeySampler(keys, self._rng, distribution, zipf_s)

    def event(self, time_ms: int) -> Event:
        kind = "url-click" if self._rng.random() < self.click_fraction else "impression"
        return {"tweet_id": f"tw-{self._key()}", "event": kind, "time": int(time_ms)}


def campaign_mapping(
    campaigns: int, *, seed: int = 0, ads_per_campaign: int = 10
) -> dict[str, str]:
    """``ad_id -> campaign_id`` for ``campaigns`` x ``ads_per_campaign`` ads, as in YSB.

    Depends only on its arguments, so the job can load the file written by the generator and
    a test can rebuild the same mapping without it.
    """
    if campaigns < 1 or ads_per_campaign < 1:
        raise ValueError("need at least one campaign and one ad per campaign")
    rng = random.Random(f"ads-mapping:{seed}")
    mapping: dict[str, str] = {}
    for _ in range(campaigns):
        campaign = _uuid(rng)
        for _ in range(ads_per_campaign):
            mapping[_uuid(rng)] = campaign
    return mapping


def write_mapping(mapping: dict[str, str], path: str | os.PathLike[str]) -> Path:
    """Writes the mapping as one JSON object; atomically, as a job may be reading the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(mapping))
    tmp.replace(path)
    return path


def load_mapping(path: str | os.PathLike[str]) -> dict[str, str]:
    path = Path(path)
    if not path.exists():
        raise InvalidRequest(
            f"campaign mapping {path} not found: `qstate generate ads --mapping {path}` "
            "writes it together with the events")
    return orjson.loads(path.read_bytes())


def default_mapping_path() -> Path:
    """Where `qstate generate ads` writes the ad -> campaign mapping and the ads job reads it
    unless told otherwise: <home>/ads-campaigns.json."""
    return Path(settings().home) / "ads-campaigns.json"


class Ads(Workload):
    """Yahoo Streaming Benchmark ad events; ``keys`` is the number of campaigns.

    ``ad_id`` is the Kafka key (as in YSB); the campaign, the aggregation key, is only
    reachable through ``mapping``.
    """

    name = "ads"
    key_field = "ad_id"
    time_field = "event_time"
    fields = AD_FIELDS
    default_topic = "ad-events"

    def __init__(
        self,
        keys: int = 1_000,
        *,
        seed: int = 0,
        ads_per_campaign: int = 10,
        users: int = 1000,
        pages: int = 100,
        distribution: Distribution = "uniform",
        zipf_s: float = 1.1,
    ) -> None:
        self.keys = keys
        self.ads_per_campaign = ads_per_campaign
        self.mapping = campaign_mapping(keys, seed=seed, ads_per_campaign=ads_per_campaign)
        # The mapping is built campaign by campaign, so ads [i*k, (i+1)*k) belong to campaign
        # i: skew is drawn over campaigns (the state keys), then an ad uniformly within one.
        self._ads = list(self.mapping)
        ids = random.Random(f"ads-pools:{seed}")
        self._users = [_uuid(ids) for _ in range(users)]
        self._ips = [
            f"{ids.randrange(1, 224)}.{ids.randrange(256)}.{ids.randrange(256)}."
            f"{ids.randrange(1, 255)}"
            for _ in range(users)
        ]
        self._pages = [_uuid(ids) for _ in range(pages)]
        self._rng = random.Random(f"ads:{seed}")
        self._campaign = KeySampler(keys, self._rng, distribution, zipf_s)

    def write_mapping(self, path: str | os.PathLike[str]) -> Path:
        return write_mapping(self.mapping, path)

    def event(self, time_ms: int) -> Event:
        rng = self._rng
        per = self.ads_per_campaign
        ad = self._ads[self._campaign() * per + rng.randrange(per)]
        user = rng.randrange(len(self._users))
        return {
            "user_id": self._users[user],
            "page_id": self._pages[rng.randrange(len(self._pages))],
            "ad_id": ad,
            "ad_type": AD_TYPES[rng.randrange(len(AD_TYPES))],
            "event_type": AD_EVENT_TYPES[rng.randrange(len(AD_EVENT_TYPES))],
            "event_time": int(time_ms),
            "ip_address": self._ips[user],
        }


def make_workload(
    name: str,
    keys: int | None = None,
    *,
    seed: int = 0,
    distribution: Distribution = "uniform",
    **options: Any,
) -> Workload:
    """``tweets`` or ``ads`` by name; ``keys`` None means the class default."""
    cls: type[Tweets] | type[Ads]
    if name == "tweets":
        cls = Tweets
    elif name == "ads":
        cls = Ads
    else:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(WORKLOAD_NAMES)}")
    if keys is not None:
        options["keys"] = keys
    return cls(seed=seed, distribution=distribution, **options)


def span_times(
    n: int, *, t0_ms: int, span_ms: int, disorder_ms: int = 0, seed: int = 0
) -> Iterator[int]:
    """``n`` event times in ``[t0, t0 + span)``: evenly spaced, each pulled back by a uniform
    lag in ``[0, disorder_ms]`` (not below ``t0``).

    Pulling back from a non-decreasing base keeps every time within ``disorder_ms`` of the
    newest one before it, which is the bound a watermark delay of ``disorder_ms`` relies on.
    """
    if n < 0 or span_ms <= 0 or disorder_ms < 0:
        raise ValueError("need n >= 0, span_ms > 0 and disorder_ms >= 0")
    rng = random.Random(f"span:{seed}")

    def times() -> Iterator[int]:  # a generator inside, so bad arguments fail at the call
        for i in range(n):
            base = t0_ms + (i * span_ms) // n
            yield max(t0_ms, base - rng.randint(0, disorder_ms)) if disorder_ms else base

    return times()


def events_over_span(
    workload: Workload,
    n: int,
    *,
    t0_ms: int,
    span_ms: int,
    disorder_ms: int = 0,
    seed: int = 0,
) -> Iterator[Event]:
    """``n`` events of ``workload`` over event time ``[t0, t0 + span)``; see ``span_times``."""
    times = span_times(n, t0_ms=t0_ms, span_ms=span_ms, disorder_ms=disorder_ms, seed=seed)
    return (workload.event(t) for t in times)


def live_events(
    workload: Workload,
    *,
    disorder_ms: int = 0,
    late_fraction: float = 0.0,
    late_by_ms: int = 60_000,
    seed: int = 0,
    clock: Callable[[], float] = time.time,
    stop: Callable[[], bool] | None = None,
) -> Iterator[Event]:
    """Endless events stamped with the wall clock (minus a lag in ``[0, disorder_ms]``), made
    lazily so a paced consumer gets times close to when it sends them. Ends when ``stop()``.

    Only lags, never leads, so the disorder bound holds; the clock is made monotonic for the
    same reason.
    """
    if disorder_ms < 0:
        raise ValueError("disorder_ms must be >= 0")
    rng = random.Random(f"live:{seed}")

    def times() -> Iterator[int]:
        newest = 0
        while stop is None or not stop():
            newest = max(newest, int(clock() * 1000))
            yield newest - rng.randint(0, disorder_ms) if disorder_ms else newest

    events: Iterator[Event] = (workload.event(t) for t in times())
    if late_fraction > 0:
        events = with_late(
            events, workload, fraction=late_fraction, late_by_ms=late_by_ms, seed=seed
        )
    return events


def with_late(
    events: Iterable[Event],
    workload: Workload,
    *,
    fraction: float,
    late_by_ms: int,
    seed: int = 0,
) -> Iterator[Event]:
    """Moves a random ``fraction`` of events to exactly ``late_by_ms`` behind the newest time
    seen so far (late events do not advance that). Events are copied, never mutated."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if late_by_ms < 0:
        raise ValueError("late_by_ms must be >= 0")
    rng = random.Random(f"late:{seed}")
    field = workload.time_field

    def moved() -> Iterator[Event]:
        newest: int | None = None
        for event in events:
            t = event[field]
            if newest is not None and rng.random() < fraction:
                yield {**event, field: newest - late_by_ms}
                continue
            newest = t if newest is None else max(newest, t)
            yield event

    return moved()


def late_events(
    workload: Workload, n: int, *, ref_ms: int, late_by_ms: int, spread_ms: int = 0, seed: int = 0
) -> list[Event]:
    """``n`` events lying ``late_by_ms`` behind ``ref_ms`` (e.g. the watermark or the newest
    time sent); with ``spread_ms``, spread uniformly over ``[ref - late_by - spread, ref -
    late_by]`` so they are at least ``late_by_ms`` behind."""
    if late_by_ms < 0 or spread_ms < 0:
        raise ValueError("late_by_ms and spread_ms must be >= 0")
    rng = random.Random(f"late-events:{seed}")
    top = ref_ms - late_by_ms
    return [workload.event(top - (rng.randint(0, spread_ms) if spread_ms else 0)) for _ in range(n)]


def max_disorder(events: Iterable[Event], time_field: str) -> int:
    """How far, at most, an event lies behind the newest time before it (0: in order)."""
    newest: int | None = None
    worst = 0
    for event in events:
        t = event[time_field]
        if newest is not None:
            worst = max(worst, newest - t)
        newest = t if newest is None else max(newest, t)
    return worst
