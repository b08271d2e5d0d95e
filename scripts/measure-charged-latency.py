#!/usr/bin/env python3
# A/B latency of sequential keep-alive requests through two `slidegate serve`
# binaries, on a rule charged after the response (cost_header), loopback only:
# a Python upstream answering at once, one client, one worker thread each.
# Prints the median latency per round and the per-round ratio B/A.
# Usage: scripts/measure-charged-latency.py BINARY_A BINARY_B ROUNDS REQUESTS_PER_ROUND
# (figures in docs/serve.md: 7 rounds of 3000, release builds)
import os, socket, statistics, subprocess, sys, threading, time

def upstream():
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0)); srv.listen(64)
    def serve(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d: return
                buf += d
            _, buf = buf.split(b"\r\n\r\n", 1)
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-ratelimit-cost: 1\r\n\r\nok")
    def loop():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1]

def start(binary, up, path):
    conf = f'''[server]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:{up}"
threads = 1
[identity]
ip_hash_secret_env = "SG_SECRET"
[[rules]]
name = "priced"
path = "/p*"
limits = [{{ limit = 1000000000, window = "1s" }}]
cost_header = "x-ratelimit-cost"
'''
    open(path, "w").write(conf)
    p = subprocess.Popen([binary, "serve", "--config", path], stderr=subprocess.PIPE, env={**os.environ, "SG_SECRET": "s", "SLIDEGATE_LOG": "warn"})
    for line in p.stderr:
        line = line.decode()
        if line.startswith("slidegate: listening on "):
            return p, int(line.split()[3].rstrip(",").rsplit(":", 1)[1])

def run(port, n):
    s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = b"GET /p HTTP/1.1\r\nhost: x\r\n\r\n"
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        s.sendall(req)
        buf = b""
        while not (b"\r\n\r\n" in buf and buf.endswith(b"ok")):
            buf += s.recv(65536)
        lat.append(time.perf_counter() - t)
    s.close()
    return statistics.median(lat) * 1e6

a, b = sys.argv[1], sys.argv[2]
rounds, n = int(sys.argv[3]), int(sys.argv[4])
import tempfile
work = tempfile.mkdtemp()
up = upstream()
pa, porta = start(a, up, os.path.join(work, "a.toml"))
pb, portb = start(b, up, os.path.join(work, "b.toml"))
run(porta, 500); run(portb, 500)
ma, mb = [], []
for _ in range(rounds):
    ma.append(run(porta, n)); mb.append(run(portb, n))
pa.kill(); pb.kill()
print("A", a, "median of round medians us", round(statistics.median(ma), 1), [round(x, 1) for x in ma])
print("B", b, "median of round medians us", round(statistics.median(mb), 1), [round(x, 1) for x in mb])
print("B/A per round", [round(y / x, 3) for x, y in zip(ma, mb)], "median", round(statistics.median([y / x for x, y in zip(ma, mb)]), 3))
