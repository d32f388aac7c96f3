#!/usr/bin/env python3
# A loopback TCP port for a server a test kills and starts again on the same port, printed (or
# returned by restartable_port() when imported). bind(port 0) gives a port of the kernel's
# ephemeral range, which any outgoing connection on the machine may take while the server is down
# (and keep for a minute in TIME_WAIT), so the restart would fail with "address already in use".
# This port lies below that range, where the kernel never picks one; it was free a moment ago.
import random
import socket


def ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(field) for field in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def restartable_port():
    low = ephemeral_range()[0]
    candidates = list(range(max(1024, low - 12000), low))
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise SystemExit("restartable_port: no free port below the ephemeral range")


if __name__ == "__main__":
    print(restartable_port())
