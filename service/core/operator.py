"""What a queryable operator is: its address, partitions, window and states.

The job writes this spec to checkpoint storage when it starts; shards and routers read it,
so none of them needs the driver to answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import orjson

from service.core import paths
from service.core.address import check_name
from service.core.config import DEFAULTS
from service.core.errors import InvalidRequest
from service.core.storage import Storage

__all__ = ["OperatorSpec", "StateType", "WindowKind", "WindowSpec", "list_specs", "load_spec",
           "save_spec"]

StateType = Literal["long", "double"]
WindowKind = Literal["tumbling", "sliding", "session", "none"]


@dataclass(frozen=True)
class WindowSpec:
    kind: WindowKind = "none"
    size_ms: int = 0
    slide_ms: int = 0
    gap_ms: int = 0


@dataclass(frozen=True)
class OperatorSpec:
    job: str
    operator: str
    key: str
    states: dict[str, StateType]
    partitions: int = DEFAULTS.partitions
    window: WindowSpec = field(default_factory=WindowSpec)
    retention_ms: int = DEFAULTS.retention_ms
    merge: Literal["upsert"] = "upsert"

    def __post_init__(self) -> None:
        check_name("job", self.job)
        check_name("operator", self.operator)
        if not self.states:
            raise InvalidRequest("an operator needs at least one state column")
        for name, kind in self.states.items():
            check_name("state", name)
            if kind not in ("long", "double"):
                raise InvalidRequest(
                    f"state {name!r}: type must be 'long' or 'double', not {kind!r}")
        if not 1 <= self.partitions <= 4096:
            raise InvalidRequest("partitions must be between 1 and 4096")

    @property
    def windowed(self) -> bool:
        return self.window.kind != "none"

    @property
    def state_names(self) -> list[str]:
        return list(self.states)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> OperatorSpec:
        raw = orjson.loads(data)
        raw["window"] = WindowSpec(**raw.get("window", {}))
        return cls(**raw)


def save_spec(storage: Storage, spec: OperatorSpec) -> None:
    path = paths.spec(spec.job, spec.operator)
    if storage.exists(path):
        old = OperatorSpec.from_json(storage.read_bytes(path))
        if old.partitions != spec.partitions:
            raise InvalidRequest(
                f"{spec.job}/{spec.operator} has {old.partitions} partitions in storage; "
                f"changing to {spec.partitions} needs a rescale step"
            )
    storage.write_bytes(path, spec.to_json())


def load_spec(storage: Storage, job: str, operator: str) -> OperatorSpec | None:
    path = paths.spec(job, operator)
    if not storage.exists(path):
        return None
    return OperatorSpec.from_json(storage.read_bytes(path))


def list_specs(storage: Storage) -> list[OperatorSpec]:
    specs = []
    for job in storage.list_dirs(paths.jobs_dir()):
        for op in storage.list_dirs(f"{paths.jobs_dir()}/{job}"):
            spec = load_spec(storage, job, op)
            if spec is not None:
                specs.append(spec)
    return specs
