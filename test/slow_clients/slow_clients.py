#!/usr/bin/env python3
"""Slow clients against a running gpufleet server (issue 14's acceptance check).

CLIENTS connections each send a request line, then one header line every INTERVAL seconds and
never finish; when the server cuts one off, it reconnects. Meanwhile /healthz is probed every
0.25 s and the nodes' states are read every second. Prints a table; exits 1 if a probe failed or
took longer than --max-latency, or if a node was ever seen not Ready.
"""
import argparse
import json
import socket
import threading
import time
import urllib.request


def slow_client(port, interval, deadline, counters, lock):
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: slow\r\n")
                with lock:
                    counters["connections"] += 1
                while time.monotonic() < deadline:
                    time.sleep(interval)
                    s.sendall(b"X-Slow: 1\r\n")
        except OSError:
            with lock:
                counters["cut_off"] += 1
            time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--max-latency", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, required=True, help="nodes expected Ready")
    args = parser.parse_args()

    deadline = time.monotonic() + args.seconds
    counters = {"connections": 0, "cut_off": 0}
    lock = threading.Lock()
    threads = [
        threading.Thread(target=slow_client, daemon=True,
                         args=(args.port, args.interval, deadline, counters, lock))
        for _ in range(args.clients)
    ]
    for t in threads:
        t.start()

    latencies, failures, not_ready = [], [], set()
    next_nodes = 0.0
    base = f"http://127.0.0.1:{args.port}"
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=args.max_latency * 5) as r:
                r.read()
            latencies.append(time.monotonic() - start)
        except OSError as e:
            failures.append(str(e))
        if start >= next_nodes:
            next_nodes = start + 1.0
            request = urllib.request.Request(base + "/v1/nodes",
                                             headers={"Authorization": "Bearer " + args.token})
            try:
                with urllib.request.urlopen(request, timeout=5) as r:
                    nodes = json.load(r).get("items", [])
                ready = [n for n in nodes if n.get("state") == "Ready"]
                if len(ready) < args.nodes:
                    not_ready.update(n.get("name") for n in nodes if n.get("state") != "Ready")
                    if len(nodes) < args.nodes:
                        not_ready.add(f"only {len(nodes)} nodes listed")
            except OSError as e:
                failures.append("nodes: " + str(e))
        time.sleep(0.25)
    for t in threads:
        t.join(timeout=args.interval + 6)

    latencies.sort()
    def pct(p):
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")
    slow = [x for x in latencies if x > args.max_latency]
    print(f"{'slow clients':<28}{args.clients}")
    print(f"{'seconds':<28}{args.seconds:g}")
    print(f"{'slow connections opened':<28}{counters['connections']}")
    print(f"{'slow connections cut off':<28}{counters['cut_off']}")
    print(f"{'/healthz probes':<28}{len(latencies) + len(failures)}")
    print(f"{'/healthz failed':<28}{len(failures)}")
    print(f"{'/healthz p50 ms':<28}{pct(0.5) * 1000:.1f}")
    print(f"{'/healthz p99 ms':<28}{pct(0.99) * 1000:.1f}")
    print(f"{'/healthz max ms':<28}{(latencies[-1] if latencies else float('nan')) * 1000:.1f}")
    print(f"{'/healthz over limit':<28}{len(slow)} (limit {args.max_latency:g} s)")
    print(f"{'nodes seen not Ready':<28}{len(not_ready)} {sorted(not_ready) if not_ready else ''}")
    ok = not failures and not slow and not not_ready and latencies
    if failures:
        print("failures:", failures[:5])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
