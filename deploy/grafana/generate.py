"""The qstate Grafana dashboards, as code: ``python deploy/grafana/generate.py`` writes
``provisioning/dashboards/*.json`` (committed; tests/deploy checks they are what this file
writes, that every expression in them answers on a running qstate, and that they are valid
for the Grafana version named here and in the provisioning files).

Standard library only: the JSON is Grafana's classic dashboard model (``schemaVersion``),
which Grafana provisions from files as is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GRAFANA = "11.6"  # the version the provisioning names; its dashboard schemaVersion:
SCHEMA_VERSION = 41
OUT = Path(__file__).resolve().parent / "provisioning" / "dashboards"

PROMETHEUS = {"type": "prometheus", "uid": "qstate-prometheus"}
ROUTER = {"type": "yesoreyeram-infinity-datasource", "uid": "qstate-router"}
RATE = "$__rate_interval"
JOB = 'job=~"$job"'  # the overview's job variable (All: every qstate job)

Panel = dict[str, Any]


class Grid:
    """Panels left to right in rows 24 units wide, ids in order."""

    def __init__(self) -> None:
        self.x = self.y = self.row_h = 0
        self.next_id = 1
        self.panels: list[Panel] = []

    def add(self, panel: Panel, w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel = {"id": self.next_id, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
                 **panel}
        self.next_id += 1
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.add({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)
        self.x, self.y, self.row_h = 0, self.y + 1, 0


def prom(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": PROMETHEUS, "expr": expr, "legendFormat": legend,
            "range": True, "instant": False}


def quantiles(metric: str, by: str, selector: str = "", qs: tuple[float, ...] = (0.5, 0.99)
              ) -> list[tuple[str, str]]:
    """histogram_quantile of ``metric`` per ``by`` (legend: the labels and the quantile);
    ``metric`` may name several (``a|b``) on the same bounds: their buckets added (each summed
    first: their series differ only by name, which a rate drops)."""
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    sums = " + ".join(
        f"sum by ({by}, le) (rate({m}_bucket{f'{{{selector}}}' if selector else ''}[{RATE}]))"
        for m in metric.split("|"))
    return [(f"histogram_quantile({q}, {sums})", f"{legend} p{q * 100:g}") for q in qs]


def timeseries(title: str, exprs: list[tuple[str, str]], unit: str, description: str,
               stack: bool = False) -> Panel:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                              "showPoints": "never"}
    if stack:
        custom |= {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40}
    return {"type": "timeseries", "title": title, "description": description,
            "datasource": PROMETHEUS,
            "targets": [prom(e, legend, chr(ord("A") + i)) for i, (e, legend) in
                        enumerate(exprs)],
            "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom",
                                   "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, expr: str, legend: str, unit: str, description: str,
         thresholds: list[tuple[float | None, str]] | None = None) -> Panel:
    steps = [{"value": v, "color": c} for v, c in (thresholds or [(None, "green")])]
    return {"type": "stat", "title": title, "description": description,
            "datasource": PROMETHEUS, "targets": [prom(expr, legend, "A")],
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": {
                "mode": "absolute", "steps": steps}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                          "values": False},
                        "colorMode": "background", "graphMode": "none", "textMode": "auto",
                        "orientation": "auto", "justifyMode": "auto"}}


def overview() -> dict[str, Any]:
    g = Grid()
    g.row("Jobs (the Spark drivers)")
    g.add(stat("Jobs up", f"min by (job) (qstate_job_up{{{JOB}}})", "{{job}}", "none",
               "1 while every query of the job runs, 0 once one has failed",
               [(None, "red"), (1, "green")]), 6, 4)
    g.add(stat("Last batch", f"max by (job, operator) (qstate_job_last_batch{{{JOB}}})",
               "{{job}}/{{operator}}", "none", "The last micro-batch committed"), 9, 4)
    g.add(stat("Assignment epoch", f"max by (job) (qstate_job_assignment_epoch{{{JOB}}})",
               "{{job}}", "none",
               "Bumped whenever partitions move between shard servers"), 9, 4)
    g.add(timeseries("Ingest", [
        (f"sum by (job) (rate(qstate_job_events_total{{{JOB}}}[{RATE}]))", "{{job}} events/s"),
        (f"sum by (job, topic) (qstate_job_lag_events{{{JOB}}})", "{{job}} {{topic}} behind"),
    ], "short", "Events read per second (dead-lettered ones too) and events in the topic "
       "not read yet"), 12, 8)
    g.add(timeseries("Batch time", [
        *quantiles("qstate_job_batch_seconds", "job", JOB),
        *quantiles("qstate_job_stage_seconds", "job, operator, stage", JOB, (0.9,)),
    ], "s", "Whole micro-batch, and by stage: spark (read, parse, partial aggregates, "
       "delta files), commit (on the shards)"), 12, 8)
    g.add(timeseries("Freshness", [
        (f"max by (job, operator, kind) (qstate_job_freshness_seconds{{{JOB}}})",
         "{{job}}/{{operator}} {{kind}}"),
    ], "s", "How old the served state is: now - watermark (kind=watermark) and now - last "
       "commit (kind=commit). Alerts: QStateFreshnessLow, QStateCommitsStalled"), 12, 8)
    g.add(timeseries("Dead letters", [
        (f"sum by (job, topic, reason) (rate(qstate_job_dead_lettered_total{{{JOB}}}[{RATE}]))",
         "{{job}} {{topic}} {{reason}}"),
    ], "short", "Records sent to <topic>.dlq per second, by reason. Alert: "
       "QStateDeadLetters"), 12, 8)
    g.add(timeseries("Commit time (driver)", [
        *quantiles("qstate_sink_commit_seconds", "job, operator", JOB),
    ], "s", "Time to commit a batch on every owning shard, seen from the driver"), 12, 8)
    g.add(timeseries("Reassignments", [
        (f"sum by (job) (increase(qstate_job_reassignments_total{{{JOB}}}[{RATE}]))",
         "{{job}}"),
    ], "short", "Partitions moved after start-up (a shard server declared dead or "
       "(re)joined)"), 12, 8)

    g.row("Shard servers")
    g.add(stat("Shards up", 'up{role="shard"}', "{{process}} {{instance}}", "none",
               "1: its /metrics answers. Alert: QStateShardDown",
               [(None, "red"), (1, "green")]), 8, 5)
    g.add(timeseries("Partitions by state", [
        (f"sum by (instance, state) (qstate_shard_partitions{{{JOB}}})",
         "{{instance}} {{state}}"),
    ], "short", "Per shard server: serving, restoring (reads answer 503), retired (moved "
       "away). Alert: QStatePartitionsRestoring", stack=True), 16, 5)
    g.add(timeseries("Commits", [
        (f"sum by (instance, result) (rate(qstate_shard_commits_total{{{JOB}}}[{RATE}]))",
         "{{instance}} {{result}}"),
    ], "short", "Partition commits per second by result (applied, skipped: already had it; "
       "anything else is a failure). Alert: QStateCommitsFailing"), 12, 8)
    g.add(timeseries("Commit time (shard)", [
        *quantiles("qstate_shard_commit_seconds", "instance", JOB),
    ], "s", "Time to apply one batch on a shard server"), 12, 8)
    g.add(timeseries("Lookup time", [
        *quantiles("qstate_shard_reader_seconds|qstate_shard_lookup_seconds", "instance"),
    ], "s", "One MultiGet call on a shard server (other hosts' routers' reads), whoever "
       "answered it: its reader (the read engine) or its Python (savepoint reads)"), 12, 8)
    g.add(timeseries("RocksDB on disk", [
        (f"sum by (instance) (qstate_shard_rocksdb_bytes{{{JOB}}})", "{{instance}}"),
    ], "bytes", "SST and WAL bytes of the partitions each server holds"), 12, 8)

    g.row("Routers")
    g.add(timeseries("HTTP requests", [
        (f"sum by (route, method) (rate(qstate_router_http_requests_total[{RATE}]))",
         "{{method}} {{route}}"),
    ], "reqps", "Requests per second by route template"), 12, 8)
    g.add(timeseries("HTTP latency", [
        *quantiles("qstate_router_http_request_seconds", "route"),
    ], "s", "By route template"), 12, 8)
    g.add(timeseries("Errors", [
        ('sum by (route, status) (rate(qstate_router_http_requests_total{status=~"5.."}'
         f"[{RATE}]))", "{{status}} {{route}}"),
        (f"sum by (reason) (rate(qstate_router_unavailable_total[{RATE}]))",
         "unavailable: {{reason}}"),
    ], "reqps", "5xx answers per second, and 503 (HTTP) / UNAVAILABLE (gRPC) by reason"),
        12, 8)
    g.add(timeseries("gRPC requests", [
        (f"sum by (method, code) (rate(qstate_router_grpc_requests_total[{RATE}]))",
         "{{method}} {{code}}"),
    ], "reqps", "The public gRPC API, by method and status code"), 12, 8)
    g.add(timeseries("Shard reads", [
        (f"sum by (path) (rate(qstate_router_shard_reads_total[{RATE}]))", "{{path}}"),
    ], "short", "Key lookups per second: local (in-process from a co-located shard's files) "
       "or remote (the owner's gRPC API)"), 24, 8)
    g.add(stat("Watchers", "sum by (form, protocol) (qstate_router_watchers)",
               "{{form}} {{protocol}}", "none",
               "Watches open now (GET /v1/watch, Server-Sent Events: http; the Watch stream: "
               "grpc), by form: keys (named keys) or top (a top-N board). At most "
               "QSTATE_MAX_WATCHERS per router"), 8, 8)
    g.add(timeseries("Watch events", [
        (f"sum by (form) (rate(qstate_router_watch_events_total[{RATE}]))", "{{form}}"),
    ], "short", "Watch events sent per second, by form (keys changed, or a board that "
       "changed)"), 8, 8)
    g.add(timeseries("Watch delay", [
        ("histogram_quantile(0.99, sum by (le) "
         f"(rate(qstate_router_watch_delay_seconds_bucket[{RATE}])))", "p99"),
    ], "s", "From a shard applying a batch to the watch event carrying its change being "
       "sent (p99, every router and form)"), 8, 8)

    job_var = {
        "name": "job", "label": "qstate job", "type": "query", "datasource": PROMETHEUS,
        "definition": "label_values(qstate_shard_partitions, job)",
        "query": "label_values(qstate_shard_partitions, job)",
        "refresh": 2, "includeAll": True, "allValue": ".*", "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [], "sort": 1, "hide": 0,
    }
    return dashboard("qstate-overview", "qstate overview", g.panels, [job_var], "10s",
                     "now-1h", "Jobs, shard servers and routers of qstate, from Prometheus "
                     "(deploy/prometheus). Alerts: deploy/prometheus/alerts.yml.")


def infinity(url: str, columns: list[tuple[str, str, str]], root: str = "",
             params: dict[str, str] | None = None, body: str | None = None,
             ref: str = "A") -> dict[str, Any]:
    """A JSON query of the router through the Infinity datasource (backend parser: gjson
    root and column selectors). ``url`` is relative to the datasource's URL."""
    options: dict[str, Any] = {"method": "GET", "data": "",
                               "params": [{"key": k, "value": v}
                                          for k, v in (params or {}).items()]}
    if body is not None:
        options |= {"method": "POST", "data": body, "body_type": "raw",
                    "body_content_type": "application/json"}
    return {"refId": ref, "datasource": ROUTER, "type": "json", "source": "url",
            "parser": "backend", "format": "table", "url": url, "url_options": options,
            "root_selector": root,
            "columns": [{"selector": s, "text": t, "type": ty} for s, t, ty in columns]}


def infinity_var(name: str, label: str, url: str, root: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": ROUTER,
            "query": {"queryType": "infinity", "refId": name,
                      "infinityQuery": infinity(url, [("name", name, "string")], root, ref=name)},
            "refresh": 1, "includeAll": False, "multi": False, "options": [], "sort": 1,
            "hide": 0, "current": {}}


def live_counts() -> dict[str, Any]:
    state = "/v1/state/${job}/${operator}/${state}"
    series = "/v1/series/${job}/${operator}/${state}/${key:percentencode}"
    g = Grid()
    g.add({"type": "stat", "title": "${key}: current window",
           "description": "The key's latest window of ${job}/${operator}/${state} "
                          "(GET /v1/series without a range)",
           "datasource": ROUTER,
           "targets": [infinity(series, [("value", "value", "number")])],
           "fieldConfig": {"defaults": {"unit": "short", "thresholds": {
               "mode": "absolute", "steps": [{"value": None, "color": "blue"}]}},
               "overrides": []},
           "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                         "values": False},
                       "colorMode": "value", "graphMode": "none", "textMode": "value",
                       "orientation": "auto", "justifyMode": "auto"}}, 8, 6)
    g.add({"type": "table", "title": "As of",
           "description": "The batch and watermark every key of the operator answers as of "
                          "at least, and the partitions answering now (GET /v1/jobs/${job})",
           "datasource": ROUTER,
           "targets": [infinity("/v1/jobs/${job}", [
               ("last_batch", "batch", "number"),
               ("watermark", "watermark", "timestamp_epoch"),
               ("partitions_available", "partitions answering", "number"),
               ("partitions", "partitions", "number")],
               root='operators.#(name=="${operator}")')],
           "fieldConfig": {"defaults": {}, "overrides": []},
           "options": {"showHeader": True}}, 16, 6)
    g.add({"type": "table", "title": "Top 10 now",
           "description": "The ten keys with the largest value of ${job}/${operator}/${state} "
                          "in the current window (the oldest still open at the watermark), "
                          "across every partition, ties by key (GET /v1/top)",
           "datasource": ROUTER,
           "targets": [infinity("/v1/top/${job}/${operator}/${state}",
                                [("key", "key", "string"), ("value", "value", "number")],
                                root="entries", params={"n": "10"})],
           "fieldConfig": {"defaults": {}, "overrides": []},
           "options": {"showHeader": True}}, 24, 9)
    g.add(timeseries("${key}: windows in the time range", [], "short",
                     "Every window of the key that the dashboard's time range holds "
                     "(GET /v1/series?from=${__from}&to=${__to}: epoch ms)") | {
        "datasource": ROUTER,
        "targets": [infinity(series, [("time", "window start", "timestamp_epoch"),
                                      ("value", "value", "number")],
                             params={"from": "${__from}", "to": "${__to}"})]}, 24, 9)
    g.add({"type": "table", "title": "Keys: current window",
           "description": "The latest window of each key of the keys variable (POST "
                          ":batchGet); a key with no data shows found=false",
           "datasource": ROUTER,
           "targets": [infinity(f"{state}:batchGet", [
               ("key", "key", "string"), ("found", "found", "string"),
               ("windows.0.value", "value", "number"),
               ("windows.0.start", "window start", "timestamp_epoch"),
               ("batch", "batch", "number")], root="results",
               body='{"keys": ${keys:json}}')],
           "fieldConfig": {"defaults": {}, "overrides": []},
           "options": {"showHeader": True, "sortBy": [{"displayName": "value",
                                                       "desc": True}]}}, 24, 9)
    variables = [
        infinity_var("job", "job", "/v1/jobs", "jobs"),
        infinity_var("operator", "operator", "/v1/jobs/${job}", "operators"),
        infinity_var("state", "state", "/v1/jobs/${job}",
                     'operators.#(name=="${operator}").states'),
        {"name": "key", "label": "key", "type": "textbox", "query": "tw-1", "hide": 0,
         "current": {"text": "tw-1", "value": "tw-1"},
         "options": [{"selected": True, "text": "tw-1", "value": "tw-1"}]},
        {"name": "keys", "label": "keys", "type": "custom", "multi": True,
         "includeAll": False, "hide": 0, "query": "tw-1,tw-2,tw-3,tw-4,tw-5",
         "current": {"text": ["tw-1", "tw-2", "tw-3", "tw-4", "tw-5"],
                     "value": ["tw-1", "tw-2", "tw-3", "tw-4", "tw-5"]},
         "options": [{"selected": True, "text": k, "value": k}
                     for k in ("tw-1", "tw-2", "tw-3", "tw-4", "tw-5")]},
    ]
    return dashboard("qstate-live-counts", "qstate live counts", g.panels, variables, "5s",
                     "now-3h", "One key's live windows and a table of several keys, read from "
                     "a qstate router (Infinity datasource, JSON over HTTP).")


def dashboard(uid: str, title: str, panels: list[Panel], variables: list[dict[str, Any]],
              refresh: str, since: str, description: str) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["qstate"],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True,
        "graphTooltip": 1, "timezone": "browser", "refresh": refresh,
        "time": {"from": since, "to": "now"},
        "timepicker": {"refresh_intervals": ["5s", "10s", "30s", "1m", "5m"]},
        "templating": {"list": variables},
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [], "panels": panels,
    }


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard."""
    return {"qstate-overview.json": overview(), "qstate-live-counts.json": live_counts()}


def render(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, d in dashboards().items():
        (OUT / name).write_text(render(d))
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
