"""No process outlives its supervisor, and a run that finds its ports taken says by whom
(issue 25). Real processes; the whole of `qstate run` killed -9 is in tests/test_run_smoke.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qstate.embedded.lifeline import holders
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[3]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie is gone too (its parent has not reaped it)
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_dies_when_its_parent_is_killed_9(tmp_path: Path) -> None:
    """A parent that starts a Child (as `qstate run` starts shards, routers, jobs) and is then
    killed outright: the child is gone within 10 s, by SIGKILL from the kernel."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from qstate.embedded.procs import Child
        c = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                  Path({str(tmp_path / "child.log")!r})).start()
        Path({str(pid_file)!r}).write_text(str(c.pid))
        time.sleep(600)
    """)], cwd=ROOT)
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, "the child started")
        child = int(pid_file.read_text())
        assert alive(child)
        parent.kill()
        parent.wait()
        t0 = time.monotonic()
        wait_until(lambda: not alive(child), 10, f"child {child} gone after its parent's kill -9")
        print(f"child gone {time.monotonic() - t0:.2f}s after the parent's SIGKILL")
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_holders_name_the_process_listening_on_a_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        [h] = holders([port, 1])  # port 1: nobody
        assert (h.port, h.pid) == (port, os.getpid())
        assert f"held by pid {os.getpid()}" in str(h) and f"kill {os.getpid()}" in str(h)
    assert holders([port]) == []


def test_qstate_run_beside_a_held_port_names_the_holder_and_exits_2(tmp_path: Path) -> None:
    """A second `make run` beside a leftover (here: this test holding the shard port) stops
    before starting anything and says which process holds which port, and how to stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {**os.environ, "QSTATE_HOME": str(tmp_path / "home"), "QSTATE_SHARD_PORT":
               str(port), "QSTATE_HTTP_PORT": "0", "QSTATE_GRPC_PORT": "0",
               "QSTATE_SHARD_METRICS_PORT": "0", "QSTATE_JOB_METRICS_PORT": "0",
               "QSTATE_KAFKA_BOOTSTRAP": f"127.0.0.1:{port + 1 if port < 65535 else 1}"}
        p = subprocess.run([sys.executable, "-m", "qstate", "run", "--duration", "1"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 2, out
    assert f"port {port} is held by pid {os.getpid()}" in out and f"kill {os.getpid()}" in out
    assert not (tmp_path / "home" / "broker").exists()  # nothing was started


# a server that forks a worker (as gunicorn does for `feast serve`): the worker is the
# server's child, started by fork alone, so no lifeline of qstate's reaches it
FORKING_SERVER = """
import os, sys, time
from pathlib import Path
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
Path(sys.argv[1]).write_text(str(pid))
time.sleep(600)
"""


@contextmanager
def parent_killed(tmp_path: Path, guard: bool) -> Iterator[tuple[int, int]]:
    """A parent process starts the forking server as a Child (under the guard or not) and is
    killed -9 once the worker runs; (the Child's pid, the worker's pid). Whatever is left
    afterwards is killed."""
    worker_file, child_file = tmp_path / "worker.pid", tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from qstate.embedded.guard import guarded
        from qstate.embedded.procs import Child
        args = [sys.executable, "-c", {FORKING_SERVER!r}, {str(worker_file)!r}]
        c = Child("server", guarded(args) if {guard} else args,
                  Path({str(tmp_path / "server.log")!r})).start()
        Path({str(child_file)!r}).write_text(str(c.pid))
        time.sleep(600)
    """)], cwd=ROOT)
    pids: list[int] = []
    try:
        wait_until(lambda: worker_file.exists() and worker_file.read_text()
                   and child_file.exists() and child_file.read_text(), 30, "the worker started")
        pids += [int(child_file.read_text()), int(worker_file.read_text())]
        assert all(alive(p) for p in pids)
        parent.kill()
        parent.wait()
        yield pids[0], pids[1]
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def test_a_guarded_servers_worker_dies_when_the_parent_is_killed_9(tmp_path: Path) -> None:
    """A server that forks workers, started under ``qstate.embedded.guard``, its parent then
    killed outright: the worker is gone too (without the guard it would live on under init,
    as `feast serve`'s gunicorn worker did: the last test shows it)."""
    with parent_killed(tmp_path, guard=True) as (child, worker):
        wait_until(lambda: not alive(worker) and not alive(child), 20,
                   f"worker {worker} and guard {child} gone after the parent's kill -9")


def test_the_guard_stops_its_command_and_passes_on_its_exit_code(tmp_path: Path) -> None:
    """SIGTERM to the guard stops the command and its worker; the guard exits with what
    ended the command (128 + SIGTERM here); a command's own exit code is the guard's."""
    from qstate.embedded.guard import guarded

    worker_file = tmp_path / "worker.pid"
    g = subprocess.Popen(guarded([sys.executable, "-c", FORKING_SERVER, str(worker_file)]),
                         cwd=ROOT)
    try:
        wait_until(lambda: worker_file.exists() and worker_file.read_text(), 30, "started")
        worker = int(worker_file.read_text())
        g.send_signal(signal.SIGTERM)
        assert g.wait(30) == 128 + signal.SIGTERM
        wait_until(lambda: not alive(worker), 10, f"worker {worker} gone")
    finally:
        if g.poll() is None:
            g.kill()
        if worker_file.exists() and alive(int(worker_file.read_text())):
            os.kill(int(worker_file.read_text()), signal.SIGKILL)
    done = subprocess.run(guarded([sys.executable, "-c", "raise SystemExit(7)"]), cwd=ROOT)
    assert done.returncode == 7
    assert subprocess.run(guarded([]), cwd=ROOT, capture_output=True).returncode == 2


def test_without_the_guard_the_worker_outlives_a_killed_parent(tmp_path: Path) -> None:
    """Why the guard exists: the same server started as a plain Child, its parent killed
    outright: the server dies (its lifeline), its forked worker does not."""
    with parent_killed(tmp_path, guard=False) as (child, worker):
        wait_until(lambda: not alive(child), 10, f"server {child} gone")
        assert alive(worker)
