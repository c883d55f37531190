"""What a queryable operator is: its address, partitions, window and states.

The job writes this spec to checkpoint storage when it starts; shards and routers read it,
so none of them needs the driver to answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import orjson

from service.keys import check_name
from service.storage import Storage

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
    partitions: int = 64
    window: WindowSpec = field(default_factory=WindowSpec)
    retention_ms: int = 24 * 3600 * 1000
    merge: Literal["upsert"] = "upsert"

    def __post_init__(self) -> None:
        check_name("job", self.job)
        check_name("operator", self.operator)
        if not self.states:
            raise ValueError("an operator needs at least one state column")
        for name, kind in self.states.items():
            check_name("state", name)
            if kind not in ("long", "double"):
                raise ValueError(f"state {name!r}: type must be 'long' or 'double', not {kind!r}")
        if not 1 <= self.partitions <= 4096:
            raise ValueError("partitions must be between 1 and 4096")

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


def spec_path(storage: Storage, job: str, operator: str) -> str:
    return storage.path("jobs", job, operator, "operator.json")


def save_spec(storage: Storage, spec: OperatorSpec) -> None:
    path = spec_path(storage, spec.job, spec.operator)
    if storage.exists(path):
        old = OperatorSpec.from_json(storage.read_bytes(path))
        if old.partitions != spec.partitions:
            raise ValueError(
                f"{spec.job}/{spec.operator} has {old.partitions} partitions in storage; "
                f"changing to {spec.partitions} needs a rescale step"
            )
    storage.write_bytes(path, spec.to_json())


def load_spec(storage: Storage, job: str, operator: str) -> OperatorSpec | None:
    path = spec_path(storage, job, operator)
    if not storage.exists(path):
        return None
    return OperatorSpec.from_json(storage.read_bytes(path))


def list_specs(storage: Storage) -> list[OperatorSpec]:
    specs = []
    jobs_dir = storage.path("jobs")
    import pyarrow.fs as pafs

    sel = pafs.FileSelector(jobs_dir, allow_not_found=True, recursive=True)
    for info in storage.fs.get_file_info(sel):
        if info.type == pafs.FileType.File and info.base_name == "operator.json":
            specs.append(OperatorSpec.from_json(storage.read_bytes(info.path)))
    return sorted(specs, key=lambda s: (s.job, s.operator))
