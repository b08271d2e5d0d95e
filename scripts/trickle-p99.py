#!/usr/bin/env python3
"""Legitimate latency through `slidegate serve`, idle and under a body trickle.

Issue 16, item 1: about 1,025 connections each sending one body byte every
5 s used to make every other client wait 1 s and get 503. This script starts
an upstream (the `minimal_hyper` example: it reads each body to its end,
then answers) and `slidegate serve` in front of it with the default
`[server]` limits, then, in each round, side by side:

  idle     R GET requests from C legitimate clients (C keep-alive
           connections, each from its own loopback address, 127.0.3.x),
           nothing else going on;
  trickle  the same, while ONE client (127.0.0.2) keeps TRICKLE_ONE
           connections trickling a POST body (one byte every 5 s, a body of
           1 MB announced) and TRICKLE_MANY clients (127.0.0.3 onwards) keep
           one each. A trickle that is answered (429 over the client's share,
           408 below the minimum rate) or closed opens again at its next
           5 s tick, as an attacker would: at a random point of it, or with
           --herd all together (1,936 connections within milliseconds).

The trickles run in a process of their own, so the measuring client's event
loop is not theirs. Prints each round's p50/p99 and the medians over the
rounds; figures are per request, in microseconds, measured at the client.

  cargo build --release -p slidegate-cli --bin slidegate --example minimal_hyper
  ulimit -n 20000
  python3 scripts/trickle-p99.py [--rounds 3] [--one 2000] [--many 200] [--requests 100000]

With --no-defences the two options issue 16 added are set to what the proxy
did before them (no minimum rate, a share per client equal to the pool).

Linux only: it binds client sockets to 127.0.0.2 and above (all of 127/8 is
routed to lo).
"""

import argparse
import asyncio
import multiprocessing
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERD = False
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(binary, example, threads, defences):
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [example, f"127.0.0.1:{upstream_port}", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    threads_line = f"threads = {threads}\n" if threads else ""
    if not defences:
        # Today's pool as it was before issue 16: no share per client, no rate.
        threads_line += "min_body_rate = 0\nmax_upstream_connections_per_client = 1024\n"
    config.write(
        f'[server]\nlisten = "127.0.0.1:0"\nupstream = "http://127.0.0.1:{upstream_port}"\n{threads_line}\n'
        '[[rules]]\nname = "api"\npath = "/api/*"\nidentity = "ip"\n'
        'limits = [{ limit = 1000000, window = "60s" }]\n'
    )
    config.close()
    proxy = subprocess.Popen(
        [binary, "serve", "--config", config.name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLIDEGATE_LOG": "error"},
    )
    for line in proxy.stderr:
        m = re.match(r"slidegate: listening on ([0-9.]+):(\d+)", line)
        if m:
            port = int(m.group(2))
            break
    else:
        sys.exit("slidegate did not start")
    # Drain the rest of its log so it never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proxy.stderr], daemon=True).start()
    time.sleep(0.3)
    return upstream, proxy, port, config.name


# ------------------------------------------------------------------ trickles


async def trickle_one(port, source, stop, counts):
    """One trickling connection, reopened at its next tick once answered."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\na")
            await writer.drain()
            counts["open"] += 1
            while not stop.is_set():
                try:
                    # An answer (429, 408) or a close ends this body.
                    data = await asyncio.wait_for(reader.read(4096), timeout=5)
                    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                    counts[status] = counts.get(status, 0) + 1
                    break
                except asyncio.TimeoutError:
                    writer.write(b"a")
                    await writer.drain()
            counts["open"] -= 1
            writer.close()
        except OSError:
            counts["error"] = counts.get("error", 0) + 1
        # Reopen at the next tick: all at once after 5 s (--herd), or at a
        # random point of the next 5 s, as connections opened over time would.
        await asyncio.sleep(5 if HERD else random.uniform(0, 5))


def trickle_process(port, one, many, stop, ready, report, herd):
    global HERD
    HERD = herd
    # The attacker's CPU is not the proxy's: on a shared 2-core machine the
    # trickling client yields to the proxy and to the measuring client.
    os.nice(10)

    async def main():
        counts = {"open": 0}
        tasks = []
        for _ in range(one):
            tasks.append(asyncio.create_task(trickle_one(port, "127.0.0.2", stop, counts)))
        for i in range(many):
            source = f"127.0.{(3 + i) // 256}.{(3 + i) % 256}"
            tasks.append(asyncio.create_task(trickle_one(port, source, stop, counts)))
        # Every connection opened and its body started; the measurement then
        # spans the refused ones reopening and the held ones sending a byte (5 s).
        await asyncio.sleep(4)
        report.put(dict(counts))
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


# ------------------------------------------------------------------ legitimate clients


async def legitimate_client(port, source, count, latencies, statuses):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    request = b"GET /api/items HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(count):
        start = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - start)
        status = int(head.split(b" ", 2)[1])
        statuses[status] = statuses.get(status, 0) + 1
        if b"connection: close" in head.lower():
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.close()


def measure(port, clients, requests):
    latencies, statuses = [], {}

    async def main():
        await asyncio.gather(
            *(
                legitimate_client(port, f"127.0.3.{1 + i}", requests // clients, latencies, statuses)
                for i in range(clients)
            )
        )

    asyncio.run(main())
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6
    return pick(0.50), pick(0.99), statuses


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/release/slidegate"))
    parser.add_argument("--upstream", default=os.path.join(ROOT, "target/release/examples/minimal_hyper"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", type=int, default=2000, help="trickling connections of the one client")
    parser.add_argument("--many", type=int, default=200, help="other trickling clients, one connection each")
    parser.add_argument("--requests", type=int, default=100000, help="legitimate requests per measurement")
    parser.add_argument("--clients", type=int, default=8, help="legitimate clients (connections)")
    parser.add_argument("--threads", type=int, default=0, help="[server] threads (0: one per CPU)")
    parser.add_argument(
        "--herd", action="store_true", help="refused trickles all reopen together, every 5 s (worst case)"
    )
    parser.add_argument(
        "--no-defences",
        action="store_true",
        help="min_body_rate = 0 and max_upstream_connections_per_client = 1024: the pool as before issue 16",
    )
    args = parser.parse_args()

    upstream, proxy, port, config = start_processes(args.binary, args.upstream, args.threads, not args.no_defences)
    rows = []
    try:
        measure(port, args.clients, args.requests)  # warm-up
        for r in range(args.rounds):
            idle = measure(port, args.clients, args.requests)
            stop, ready, report = multiprocessing.Event(), multiprocessing.Event(), multiprocessing.Queue()
            trickler = multiprocessing.Process(
                target=trickle_process, args=(port, args.one, args.many, stop, ready, report, args.herd)
            )
            trickler.start()
            ready.wait(30)
            loaded = measure(port, args.clients, args.requests)
            counts = report.get(timeout=5)
            stop.set()
            trickler.join(30)
            rows.append((idle, loaded))
            print(
                f"round {r + 1}: idle p50 {idle[0]:.0f} µs p99 {idle[1]:.0f} µs {idle[2]} | "
                f"trickle p50 {loaded[0]:.0f} µs p99 {loaded[1]:.0f} µs {loaded[2]} | "
                f"p99 ratio {loaded[1] / idle[1]:.2f} | trickles at the start: {counts}",
                flush=True,
            )
            time.sleep(1)
    finally:
        proxy.terminate()
        upstream.terminate()
        os.unlink(config)
    med = lambda xs: statistics.median(xs)
    idle99, load99 = med([i[1] for i, _ in rows]), med([l[1] for _, l in rows])
    ratios = [l[1] / i[1] for i, l in rows]
    print(
        f"median over {len(rows)} rounds: idle p50 {med([i[0] for i, _ in rows]):.0f} µs, p99 {idle99:.0f} µs; "
        f"trickle p50 {med([l[0] for _, l in rows]):.0f} µs, p99 {load99:.0f} µs; "
        f"p99 ratio (median of rounds) {med(ratios):.2f} (range {min(ratios):.2f}–{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
