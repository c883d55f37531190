"""Hosts emulated on one machine with Linux network namespaces (root only).

A :class:`Network` is a bridge in the root namespace with an address of its own (the test,
which runs there, reaches every host through it), and each :class:`Host` a namespace
joined to the bridge by a veth pair, with its own address and loopback. Hosts share the
filesystem, so a folder serves as the cluster's shared checkpoint storage; they do not share
ports or addresses, so a process bound to one host's address is not reachable on another's,
and a host's link can be cut (:meth:`Host.cut`) or all of its processes killed at once
(:meth:`Host.kill_all`, a machine that loses power).

Everything is named with a prefix chosen per network, and :meth:`Network.close` removes
what it made (processes first, by the PIDs its namespaces hold), so nothing outlives a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Host", "NetnsError", "Network"]

log = logging.getLogger(__name__)


class NetnsError(RuntimeError):
    """A namespace, link or address could not be set up (not root? no ``ip``?)."""


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode} (network "
                         "namespaces need root and iproute2)")


@dataclass
class Host:
    name: str  # the namespace
    address: str
    link: str  # the veth end on the bridge (root namespace)

    def command(self, *args: str) -> list[str]:
        """``args`` run on this host: ``ip netns exec`` switches namespace and execs, so the
        PID started is the command's own."""
        return ["ip", "netns", "exec", self.name, *args]

    def spawn(self, args: list[str], log_path: Path, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            return subprocess.Popen(self.command(*args), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def pids(self) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True,
                           timeout=30)
        return [int(p) for p in r.stdout.split()]

    def kill_all(self, sig: int = signal.SIGKILL, timeout: float = 30.0) -> int:
        """Every process on this host gets ``sig`` (kill -9 by default: the host died).
        Returns how many there were; waits until none is left."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(pids)

    def cut(self) -> None:
        """The host's cable pulled: its link to the bridge goes down (processes keep running)."""
        _ip("link", "set", self.link, "down")

    def mend(self) -> None:
        _ip("link", "set", self.link, "up")


@dataclass
class Network:
    """A /24 of hosts: the bridge is ``<subnet>.1``, hosts get ``.2`` upwards."""

    prefix: str = "qs"
    subnet: str = "10.231.7"
    hosts: dict[str, Host] = field(default_factory=dict)
    _up: bool = False

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    def open(self) -> Network:
        self.close()  # what a killed earlier run left behind
        _ip("link", "add", self.bridge, "type", "bridge")
        self._up = True
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add(self, name: str) -> Host:
        n = len(self.hosts) + 2
        ns, link = f"{self.prefix}-{name}", f"{self.prefix}v{n}"
        host = Host(ns, f"{self.subnet}.{n}", link)
        _ip("netns", "add", ns)
        self.hosts[name] = host
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        # processes talk to themselves over loopback too (Spark's Python workers, Kafka's
        # controller listener)
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Kill what runs on the hosts, delete the namespaces and the bridge; also those of
        an earlier run with the same prefix that did not get to close."""
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                               timeout=30).stdout.split("\n")
        ours = {line.split()[0] for line in names if line.startswith(f"{self.prefix}-")}
        for ns in ours | {h.name for h in self.hosts.values()}:
            Host(ns, "", "").kill_all()
        # the veth pairs from the root side first: a deleted namespace is torn down later,
        # in the kernel's own time, and its pairs with it (a new run would find them taken)
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                               timeout=30).stdout.split("\n")
        for line in links:
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(f"{self.prefix}v"):
                subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)
        for ns in ours | {h.name for h in self.hosts.values()}:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        self.hosts.clear()
        self._up = False

    def __enter__(self) -> Network:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
