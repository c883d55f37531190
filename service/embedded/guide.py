"""What `qstate run` prints about where to look: metrics endpoints, Prometheus and Grafana
(``deploy/``) once every process is up, and the queries once a key answers."""

from __future__ import annotations

import os
from pathlib import Path

from qstate.embedded.prometheus import Target

__all__ = ["GRAFANA_IMAGE", "endpoints", "queries"]

ROOT = Path(__file__).resolve().parents[2]  # the repository, when run from a checkout
GRAFANA_IMAGE = "grafana/grafana:11.6.0"  # the version deploy/grafana/provisioning names
INFINITY = "yesoreyeram-infinity-datasource"


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when that is shorter."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(path)


def endpoints(targets: list[Target], targets_file: Path) -> str:
    width = max(len(t.process) for t in targets)
    lines = [f"metrics (Prometheus targets in {_shown(targets_file)}):"]
    lines += [f"  {t.process:<{width}}  http://{t.address}/metrics" for t in targets]
    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    if not config.exists():  # an installed package: deploy/ is in the repository
        return "\n".join([*lines, "Prometheus and Grafana: deploy/ of the qstate repository"])
    data = targets_file.parent / "data"
    lines += ["Prometheus (scrapes all of them, evaluates deploy/prometheus/alerts.yml):",
              f"  prometheus --config.file={_shown(config)} "
              f"--storage.tsdb.path={_shown(data)}"]
    if targets_file.resolve() != (ROOT / ".qstate" / "prometheus" / "targets.json").resolve():
        lines.append(f"  (that file reads .qstate/prometheus/targets.json: point its "
                     f"file_sd at {targets_file})")
    lines += [f"Grafana 11.6+ with the {INFINITY} plugin, provisioned from "
              f"{_shown(provisioning)} (dashboards 'qstate overview', 'qstate live counts'):",
              f"  GF_PATHS_PROVISIONING={provisioning} grafana server "
              f"--homepath /usr/share/grafana",
              f"  or: docker run --rm --network host -v {provisioning}:/etc/grafana/provisioning "
              f"-e GF_INSTALL_PLUGINS={INFINITY} {GRAFANA_IMAGE}",
              "  then http://127.0.0.1:3000 (deploy/grafana/README.md)"]
    return "\n".join(lines)


def queries(url: str, grpc_port: int, key: str, home: Path = Path(".qstate")) -> str:
    return "\n".join([
        "live counts are queryable:",
        f"  curl -s {url}/v1/state/tweets/per_tweet_1h/impressions/{key}",
        f"  curl -s '{url}/v1/state/tweets/per_tweet_1m/impressions/{key}?from=now-15m'",
        f"  curl -s '{url}/v1/series/tweets/per_tweet_1m/impressions/{key}?from=now-1h'",
        f"  .venv/bin/qstate get tweets per_tweet_1h clicks {key}",
        f"  node clients/node/query.mjs get tweets per_tweet_1h impressions {key}"
        f"   # gRPC on 127.0.0.1:{grpc_port}",
        f"  UI: {url}/ui   API docs: {url}/docs   router metrics: {url}/metrics",
        f"  QSTATE_CLUSTER_TOKEN_FILE={_shown(home / 'cluster-token')} .venv/bin/qstate state "
        "inspect   # partitions (the shard API asks for the demo's cluster token)",
    ])
