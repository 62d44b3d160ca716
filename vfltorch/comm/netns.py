"""Simulated hosts on one machine: one Linux network namespace per party (tests, benchmarks).

``SimulatedHosts(q, rate="100mbit")`` builds a switch namespace holding a
bridge, and q host namespaces, each with its own address (10.218.0.1, ...)
on a veth link to the bridge. ``rate`` limits every host's link in both
directions with ``tc qdisc ... tbf`` (netem is not available here, so no
added delay); ``rates={i: "1mbit"}`` gives host i its own rate (a slow
organisation among fast ones). The token bucket holds a tenth of a second
at the rate (16 KB to 512 KB), so a slow link is slow from its first bytes. Needs root (CAP_NET_ADMIN); ``available()`` says whether it
can be done and why not. Use as a context manager: the namespaces are
deleted on exit, whatever happens inside.
"""

from __future__ import annotations

import os
import subprocess

SUBNET = "10.218.0"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def available() -> tuple[bool, str]:
    """(True, '') when namespaces can be built here, else (False, the reason)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_NET_ADMIN); run as root, as CI does"
    probe = f"vflprobe{os.getpid()}"
    try:
        r = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return False, "the `ip` command (iproute2) is not installed"
    if r.returncode != 0:
        return False, f"`ip netns add` failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    try:
        subprocess.run(["tc", "-V"], check=True, capture_output=True)
    except (FileNotFoundError, subprocess.CalledProcessError):
        return False, "the `tc` command (iproute2) is not installed"
    return True, ""


_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def _burst_bytes(rate: str) -> int:
    """A tenth of a second of ``rate`` ("1mbit", "100mbit", "1gbit"), within 16 KB and 512 KB."""
    for unit, scale in _UNITS.items():
        if rate.endswith(unit):
            bits = float(rate[:-len(unit)]) * scale
            return int(min(512 * 1024, max(16 * 1024, bits / 8 / 10)))
    raise ValueError(f"a rate such as '1mbit', '100mbit' or '1gbit', got {rate!r}")


class SimulatedHosts:
    def __init__(self, q: int, rate: str | None = None, *, rates: dict | None = None, tag: str | None = None):
        if not 1 <= q <= 200:
            raise ValueError(f"1 to 200 hosts, got {q}")
        self.q, self.rate = q, rate
        self.rates = {i: (rates or {}).get(i, rate) for i in range(q)}
        self.tag = tag or f"vfl{os.getpid() % 100000}"
        self.switch = f"{self.tag}sw"
        self.hosts = [f"{self.tag}h{i}" for i in range(q)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(q)]
        self._made: list[str] = []

    def __enter__(self) -> "SimulatedHosts":
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _build(self):
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.switch)
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{i}", "up")
            if self.rates[i]:
                # Uplink (host egress) and downlink (switch egress towards the host), each at the host's rate.
                burst = f"{_burst_bytes(self.rates[i]) // 1024}kb"
                for where, dev in ((ns, "eth0"), (self.switch, f"p{i}")):
                    subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                    "rate", self.rates[i], "burst", burst, "latency", "400ms"],
                                   check=True, capture_output=True, text=True)

    def exec_prefix(self, i: int) -> list[str]:
        """Prefix a command with this to run it on host i."""
        return ["ip", "netns", "exec", self.hosts[i]]

    def close(self):
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
