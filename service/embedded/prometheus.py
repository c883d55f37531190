"""Prometheus's view of the processes ``qstate run`` starts: a file_sd targets file,
``<home>/prometheus/targets.json``, which ``deploy/prometheus/prometheus.yml`` reads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Target", "targets_path", "write_targets"]


@dataclass(frozen=True)
class Target:
    role: str  # job | shard | router: what alerts and dashboards select on
    process: str  # its name in qstate run: jobs, shard-0, router
    address: str  # host:port of its /metrics


def targets_path(home: Path) -> Path:
    return home / "prometheus" / "targets.json"


def write_targets(path: Path, targets: list[Target]) -> None:
    """One target group per process. Replaced in one step: Prometheus re-reads the file
    when it changes, and a half-written one would drop every target."""
    groups = [{"targets": [t.address], "labels": {"role": t.role, "process": t.process}}
              for t in targets]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    os.replace(tmp, path)
