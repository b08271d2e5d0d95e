#!/usr/bin/env python3
# What /readyz costs where it checks the store (a rule with on_error = "deny",
# Redis up): store calls (Redis `INFO commandstats`, eval*) over 5 s of
# back-to-back probes, then the median and p99 latency of 3000 sequential
# keep-alive probes, against /healthz (no store). Loopback only; spawns its
# own redis-server on a free port (never 6379).
# Usage: scripts/measure-readyz.py BINARY
import http.client, os, socket, statistics, subprocess, sys, time, tempfile
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
rport, up, admin = free_port(), free_port(), free_port()
d = tempfile.mkdtemp()
redis = subprocess.Popen(["redis-server", "--port", str(rport), "--save", "", "--bind", "127.0.0.1", "--dir", d], stdout=subprocess.DEVNULL)
time.sleep(0.3)
cfg = f'''[server]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:{up}"
admin_listen = "127.0.0.1:{admin}"
threads = 1
[store]
url = "redis://127.0.0.1:{rport}"
on_error = "deny"
[identity]
ip_hash_secret_env = "S"
[[rules]]
name = "r"
path = "/*"
limits = [{{ limit = 10, window = "1s" }}]
'''
open(f"{d}/c.toml", "w").write(cfg)
sg = subprocess.Popen([sys.argv[1], "serve", "--config", f"{d}/c.toml"], env={**os.environ, "S": "x"}, stderr=subprocess.PIPE)
while True:
    line = sg.stderr.readline()
    if not line: sys.exit("slidegate did not start")
    if b"listening on" in line: break
def calls():
    out = subprocess.run(["redis-cli", "-p", str(rport), "info", "commandstats"], capture_output=True, text=True).stdout
    return sum(int(l.split("calls=")[1].split(",")[0]) for l in out.splitlines() if l.startswith("cmdstat_eval"))
def run(path, n):
    c = http.client.HTTPConnection("127.0.0.1", admin); lat = []
    before, start = calls(), time.monotonic()
    for _ in range(n):
        t = time.perf_counter(); c.request("GET", path); r = c.getresponse(); r.read(); lat.append((time.perf_counter() - t) * 1e6)
        assert r.status == 200, r.status
    took = time.monotonic() - start
    return statistics.median(lat), sorted(lat)[int(n * .99)], calls() - before, took
def timed(path, secs):
    c = http.client.HTTPConnection("127.0.0.1", admin); n = 0
    before, end = calls(), time.monotonic() + secs
    while time.monotonic() < end:
        c.request("GET", path); r = c.getresponse(); r.read(); n += 1
    return n, calls() - before
n, store = timed("/readyz", 5)
print(f"/readyz for 5 s: {n} probes, store calls {store}")
for path in ["/healthz", "/readyz", "/healthz", "/readyz"]:
    med, p99, store, took = run(path, 3000)
    print(f"{path}: 3000 probes in {took:.2f} s, median {med:.0f} us, p99 {p99:.0f} us, store calls {store}")
sg.terminate(); sg.wait(); redis.terminate()
