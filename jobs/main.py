"""`qstate job ...`: run example jobs in one SparkSession until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import nullcontext

from prometheus_client import start_http_server
from rich.console import Console
from rich.live import Live
from rich.text import Text

from jobs.runner import JobConfig, RunningJob, start_job
from jobs.spark import spark_session

console = Console(stderr=True)


def _status(jobs: list[RunningJob]) -> Text:
    line = Text()
    for job in jobs:
        for name, q in job.queries.items():
            p = q.lastProgress
            last = job.stats[name].last
            rate = (f"{p['inputRowsPerSecond'] or 0:,.0f} in/s "
                    f"{p['processedRowsPerSecond'] or 0:,.0f} proc/s") if p else "starting"
            batch = (f"batch {last.batch} commit {last.commit_s * 1000:.0f}ms"
                     if last else "no batch yet")
            line.append(f"{job.config.job}/{name}: ", style="bold")
            line.append(f"{rate}, {batch}   ")
    return line


def run_jobs(configs: list[JobConfig], metrics_port: int = 0, master: str = "local[2]",
             shuffle_partitions: int = 4, live: bool = True,
             spark_conf: dict[str, str] | None = None, metrics_host: str = "127.0.0.1") -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if metrics_port:
        start_http_server(metrics_port, addr=metrics_host)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    spark = spark_session("qstate-" + "-".join(c.job for c in configs), master,
                          shuffle_partitions, spark_conf)
    running = [start_job(spark, c) for c in configs]
    console.print(f"[green]running[/green] {', '.join(c.job for c in configs)} "
                  f"(checkpoints under {configs[0].checkpoint.parent})")
    try:
        with Live(_status(running), console=console, refresh_per_second=1,
                  transient=True) if live else nullcontext() as view:
            while not stop.is_set():
                for job in running:
                    job.check()
                    job.export_metrics()
                if view is not None:
                    view.update(_status(running))
                stop.wait(1.0)
    finally:
        t0 = time.monotonic()
        for job in running:
            job.stop()
        spark.stop()
        console.print(f"stopped in {time.monotonic() - t0:.1f}s")
