#!/usr/bin/env python3
# The soak harness's load and its verdict (scripts/soak.sh), stdlib only,
# loopback only, bounded in rate and time.
#
#   soak-driver.py rules
#       the [[rules]] every instance runs (soak.sh appends them to each
#       configuration, so the limits the oracle checks have one home: RULES)
#   soak-driver.py load --ports P1,P2,P3 --secs S --out FILE
#       the load, for S seconds, spread over the instances:
#         hot    one API key hammering one rule (HTTP/1.1 keep-alive)
#         warm   20 keys at a few requests a second each, near their limit
#         churn  keys drawn from 100,000 (each seen rarely)
#         h2     curl --http2-prior-knowledge, 40 concurrent streams per connection
#         ws     WebSocket handshakes, 5 echoed frames each, then a close;
#                plus one long-lived tunnel per instance pinged every second
#       and writes every admission of the oracle's rules, latencies and
#       answers by kind to FILE (JSON)
#   soak-driver.py report --load FILE --samples FILE --faults FILE --reloads FILE
#                  --cycles FILE [--flat-mb M] [--json FILE]
#       the oracle, processes' RSS and fds, errors and p99 by kind; exits 1 on
#       a verdict that fails (see `report` below for each criterion)
import argparse, base64, collections, http.client, json, os, random, socket, subprocess
import sys, threading, time

INSTANCES = 3
# name: (path, limit, window_ms, checked by the oracle). Every checked rule is a
# fixed window, `[k·W, (k+1)·W)` on the epoch: the oracle buckets by the same
# arithmetic. The hot rule's limit is unique, so soak.sh can find its key
# (`*:fw:300:5000`) and the master holding it.
RULES = {
    "hot": ("/hot", 300, 5000, True),
    "warm": ("/warm", 10, 5000, True),
    "churn": ("/churn/*", 5, 10000, True),
    "h2": ("/h2/*", 1000, 10000, False),
    "ws": ("/ws*", 1000, 10000, False),
}
HOT_RATE = 100  # requests a second, over 6 threads
WARM_KEYS, WARM_RATE = 20, 3  # requests a second per key
CHURN_SPACE, CHURN_RATE = 100_000, 100
H2_RATE = 40  # requests a second, over 2 curl loops
WS_RATE = 4  # handshakes a second, over 2 threads


def rules_toml():
    out = []
    for name, (path, limit, window_ms, _) in RULES.items():
        out.append(f'[[rules]]\nname = "{name}"\npath = "{path}"\n'
                   f'limits = [{{ limit = {limit}, window = "{window_ms}ms", algorithm = "fixed_window" }}]\n')
    return "\n".join(out)


class Tally:
    """Answers, errors and latencies by client kind; admissions of checked rules."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answers = collections.defaultdict(collections.Counter)  # kind -> "200"/"429"/"conn:Error"
        self.latency = collections.defaultdict(list)  # kind -> seconds
        self.admitted = collections.defaultdict(lambda: collections.defaultdict(list))  # rule -> key -> [(t0, t1)]
        self.denied = collections.Counter()  # rule -> count

    def answer(self, kind, status, t0, t1, rule=None, key=None):
        with self.lock:
            self.answers[kind][str(status)] += 1
            self.latency[kind].append(t1 - t0)
            if rule is not None and status == 200:
                self.admitted[rule][key].append((t0, t1))
            elif rule is not None and status == 429:
                self.denied[rule] += 1

    def error(self, kind, err):
        with self.lock:
            self.answers[kind]["conn:" + type(err).__name__] += 1


def paced(rate, deadline):
    """Yields at `rate` a second until `deadline`, never in a burst to catch up."""
    gap, nxt = 1.0 / rate, time.monotonic()
    while True:
        nxt += gap
        now = time.monotonic()
        if now >= deadline:
            return
        if nxt > now:
            time.sleep(nxt - now)
        else:
            nxt = now
        yield


class Client:
    """One keep-alive HTTP/1.1 connection per instance, reopened after an error."""

    def __init__(self, ports):
        self.ports, self.conns = ports, {}

    def get(self, i, path, key):
        conn = self.conns.get(i) or http.client.HTTPConnection("127.0.0.1", self.ports[i], timeout=10)
        self.conns[i] = conn
        try:
            conn.request("GET", path, headers={"x-api-key": key})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except Exception:
            conn.close()
            self.conns.pop(i, None)
            raise


def http_loop(tally, kind, ports, rate, deadline, pick):
    """`pick()` -> (instance, path, key, rule or None)."""
    client = Client(ports)
    for _ in paced(rate, deadline):
        i, path, key, rule = pick()
        t0 = time.time()
        try:
            status = client.get(i, path, key)
        except Exception as err:
            tally.error(kind, err)
            continue
        tally.answer(kind, status, t0, time.time(), rule, key)


def h2_loop(tally, ports, rate, deadline, n):
    per = 40
    for _ in paced(rate / per, deadline):
        i, key = n % len(ports), f"soak-h2-{random.randrange(CHURN_SPACE)}"
        n += 1
        t0 = time.time()
        try:
            out = subprocess.run(
                # 40 streams at once on one connection: curl 7.88 fails a request that
                # reuses a prior-knowledge connection after another ended (curl#10634),
                # not one multiplexed beside others.
                ["curl", "-s", "--http2-prior-knowledge", "--parallel", "--parallel-immediate",
                 "--parallel-max", str(per), "-o", "/dev/null", "-H", f"x-api-key: {key}",
                 "--max-time", "20", "-w", "%{http_code} %{time_total} %{http_version}\\n",
                 f"http://127.0.0.1:{ports[i]}/h2/[1-{per}]"],
                capture_output=True, text=True, timeout=30).stdout
        except subprocess.TimeoutExpired as err:
            tally.error("h2", err)
            continue
        lines = out.split()
        for code, total, version in zip(lines[0::3], lines[1::3], lines[2::3]):
            if code == "000":
                tally.error("h2", ConnectionError("curl"))
            elif version != "2":
                tally.error("h2", ValueError(f"http{version}"))
            else:
                tally.answer("h2", int(code), t0, t0 + float(total))


def ws_frame(payload, opcode=0x1):
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_read(sock_file):
    head = sock_file.read(2)
    if len(head) < 2:
        raise ConnectionError("tunnel closed")
    return head[0] & 0x0F, sock_file.read(head[1] & 0x7F)


def ws_open(port, key):
    """The handshake; returns (status, socket, its reader)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    nonce = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\nx-api-key: {key}\r\n\r\n").encode())
    reader = sock.makefile("rb")
    status = int(reader.readline().split()[1])
    while reader.readline() not in (b"\r\n", b""):
        pass
    return status, sock, reader


def ws_echo(tally, kind, sock, reader, text):
    t0 = time.time()
    sock.sendall(ws_frame(text))
    opcode, payload = ws_read(reader)
    if opcode != 0x1 or payload != text:
        raise ValueError("echo mismatch")
    tally.answer(kind, "echo", t0, time.time())


def ws_loop(tally, ports, rate, deadline, n):
    for _ in paced(rate, deadline):
        i = n % len(ports)
        n += 1
        t0 = time.time()
        try:
            status, sock, reader = ws_open(ports[i], f"soak-ws-{random.randrange(CHURN_SPACE)}")
            tally.answer("ws", status, t0, time.time())
            with sock:
                if status == 101:
                    for j in range(5):
                        ws_echo(tally, "ws-frame", sock, reader, f"frame {j}".encode())
                    sock.sendall(ws_frame(b"", 0x8))
                    ws_read(reader)
        except Exception as err:
            tally.error("ws", err)


def ws_long(tally, port, deadline):
    """One tunnel kept open across reloads and faults, pinged every second."""
    sock = None
    while time.monotonic() < deadline:
        try:
            if sock is None:
                t0 = time.time()
                status, sock, reader = ws_open(port, "soak-ws-long")
                tally.answer("ws-long", status, t0, time.time())
                if status != 101:
                    sock.close()
                    sock = None
                    time.sleep(1)
                    continue
            ws_echo(tally, "ws-long-frame", sock, reader, b"ping")
            time.sleep(1)
        except Exception as err:
            tally.error("ws-long", err)
            if sock is not None:
                sock.close()
            sock = None
            time.sleep(1)
    if sock is not None:
        sock.close()


def load(args):
    ports = [int(p) for p in args.ports.split(",")]
    deadline = time.monotonic() + args.secs
    tally = Tally()
    started = time.time()
    threads = []

    def spawn(target, *a):
        t = threading.Thread(target=target, args=a, daemon=True)
        t.start()
        threads.append(t)

    for t in range(6):
        spawn(http_loop, tally, "hot", ports, HOT_RATE / 6, deadline,
              lambda t=t: (t % INSTANCES, "/hot", "soak-hot", "hot"))
    warm = [f"soak-warm-{k}" for k in range(WARM_KEYS)]
    for t in range(4):
        spawn(http_loop, tally, "warm", ports, WARM_KEYS * WARM_RATE / 4, deadline,
              lambda t=t: (random.randrange(INSTANCES), "/warm", random.choice(warm[t::4]), "warm"))
    for t in range(4):
        def churn():
            k = random.randrange(CHURN_SPACE)
            return random.randrange(INSTANCES), f"/churn/{k}", f"soak-churn-{k}", "churn"
        spawn(http_loop, tally, "churn", ports, CHURN_RATE / 4, deadline, churn)
    for t in range(2):
        spawn(h2_loop, tally, ports, H2_RATE / 2, deadline, t)
        spawn(ws_loop, tally, ports, WS_RATE / 2, deadline, t)
    for port in ports:
        spawn(ws_long, tally, port, deadline)
    for t in threads:
        t.join(timeout=max(0, deadline - time.monotonic()) + 40)
    with open(args.out, "w") as f:
        json.dump({
            "started": started, "ended": time.time(), "rules": RULES, "instances": INSTANCES,
            "answers": tally.answers, "latency": tally.latency, "denied": tally.denied,
            "admitted": {rule: dict(keys) for rule, keys in tally.admitted.items()},
        }, f)


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def oracle(result, touched):
    """Per checked rule, identity and window: the admissions that certainly fell
    in the window (sent and answered in it) against the documented bound.

    The bound (docs/serve.md): `limit` while the store answers ("Quota leases":
    never over the limit); in a window a fault or a fallback decision touched,
    `limit + N·⌊limit/N⌋` ("Circuit breaker and fallback", *Over-admission
    bound*: the store admits at most `limit`, each instance's fallback at most
    `⌊limit/N⌋`). A manual CLUSTER FAILOVER waits for the replica to catch
    up, so no acknowledged write is lost; a killed master loses what it had
    not yet replicated ("Lost writes": an identity can be admitted again up to
    what was lost, at most `limit` more), so a window a kill touched has
    `limit` more. `touched(rule, start, end)` names the faults that touched
    the window: None if none did, else the set of their kinds."""
    n = result["instances"]
    out = {}
    for rule, (_, limit, window_ms, checked) in result["rules"].items():
        if not checked:
            continue
        loose = limit + n * (limit // n)
        killed = loose + limit
        w = window_ms / 1000
        windows = over_limit = over_touched = beyond = 0
        worst = (0, None, None)
        for key, times in result["admitted"].get(rule, {}).items():
            certain = collections.Counter(int(t0 // w) for t0, t1 in times if int(t0 // w) == int(t1 // w))
            windows += len(certain)
            for k, count in certain.items():
                kinds = touched(rule, k * w, (k + 1) * w)
                is_touched = kinds is not None
                bound = limit if not is_touched else killed if "kill" in kinds else loose
                if count > limit:
                    over_touched += is_touched
                    over_limit += not is_touched
                if count > bound:
                    beyond += 1
                if count > worst[0]:
                    worst = (count, key, k * w)
        out[rule] = {
            "limit": limit, "window_ms": window_ms, "bound_when_touched": loose, "bound_when_killed": killed,
            "identities": len(result["admitted"].get(rule, {})), "windows": windows,
            "admitted": sum(len(t) for t in result["admitted"].get(rule, {}).values()),
            "denied": result["denied"].get(rule, 0),
            "max_in_a_window": worst[0], "max_key": worst[1], "max_window_start": worst[2],
            "windows_over_limit_touched": over_touched, "windows_over_limit_clear": over_limit,
            "windows_beyond_bound": beyond,
        }
    return out


def report(args):
    with open(args.load) as f:
        result = json.load(f)
    faults = []  # (start, end, what)
    with open(args.faults) as f:
        for line in f:
            start, end, what = line.rstrip("\n").split(" ", 2)
            faults.append((float(start), float(end), what))
    with open(args.cycles) as f:
        cycles = [float(line) for line in f if line.strip()]
    # samples: time kind name pid rss_kb fds fallback_total (or "dead")
    procs = collections.defaultdict(list)
    fallback = collections.defaultdict(list)  # instance -> [(t, {rule: n})]
    with open(args.samples) as f:
        for line in f:
            t, kind, name, pid, rest = line.split(" ", 4)
            procs[(kind, name)].append((float(t), rest.split(None, 2)))
    for (kind, name), rows in procs.items():
        if kind == "serve":
            for t, fields in rows:
                # A sample whose /metrics could not be read ("null") is left
                # out: read as no fallback yet, it would make the next one
                # look like fallback decisions, loosening the bound.
                if fields[0] != "dead" and json.loads(fields[2]) is not None:
                    fallback[name].append((t, json.loads(fields[2])))
    # Intervals in which some instance decided requests of a rule by its fallback.
    fell_back = collections.defaultdict(list)
    for rows in fallback.values():
        for (t0, a), (t1, b) in zip(rows, rows[1:]):
            for rule in set(a) | set(b):
                if b.get(rule, 0) > a.get(rule, 0):
                    fell_back[rule].append((t0, t1))

    def touched(rule, start, end):
        spans = [(s, e, what.split(":")[0]) for s, e, what in faults] + [(s, e, "fallback") for s, e in fell_back[rule]]
        kinds = {kind for s, e, kind in spans if s < end and e > start}
        return kinds or None

    def killed_then(name, t):
        """Whether redis node `name` was down for a kill of the soak's at `t`:
        a sample's time is when its round began, and reading /metrics of
        each instance first can take seconds, so a node seen dead a little
        before the kill's recorded start was seen after it."""
        return any(what.startswith(f"kill: master {name} ") and s - 5 <= t <= e for s, e, what in faults)

    verdicts = oracle(result, touched)
    failures = []
    # The fallback decides while the store cannot; long after every fault
    # has ended, an instance still deciding by it has lost its store for
    # good (a connection stuck after a kill): a failure, not a fault.
    recovered_within = 30
    for name, rows in sorted(fallback.items()):
        for (t0, a), (t1, b) in zip(rows, rows[1:]):
            if sum(b.values()) > sum(a.values()) and not any(s - 5 < t1 and e + recovered_within > t0 for s, e, _ in faults):
                failures.append(f"serve {name}: decided by its fallback at +{t0 - result['started']:.0f}s,"
                                f" more than {recovered_within} s after any fault")
                break
    for rule, v in verdicts.items():
        if v["windows_beyond_bound"]:
            failures.append(f"oracle: {rule}: {v['windows_beyond_bound']} windows over their bound")

    # Processes: alive throughout, RSS and fds after warm-up vs at the end.
    secs = result["ended"] - result["started"]
    warm_until = result["started"] + max(10, secs / 4)
    proc_report = {}
    for (kind, name), rows in sorted(procs.items()):
        live = [(t, int(f[0]), int(f[1])) for t, f in rows if f[0] != "dead"]
        dead = any(f[0] == "dead" and not (kind == "redis" and killed_then(name, t)) for t, f in rows)
        if dead:
            failures.append(f"{kind} {name} died")
        if not live:
            continue
        base = next(((r, d) for t, r, d in live if t >= warm_until), (live[-1][1], live[-1][2]))
        rss = [r for _, r, _ in live]
        fds = [d for _, _, d in live]
        # RSS at each tenth of the run, to tell maps filling to their bound from a leak.
        tenths = [next((r for t, r, _ in live if t >= result["started"] + secs * k / 10), rss[-1]) for k in range(11)]
        # RSS at the end of each fault cycle (the first sample after it).
        by_cycle = [next((r for t, r, _ in live if t >= end), rss[-1]) for end in cycles]
        entry = {"rss_kb": {"first": rss[0], "after_warmup": base[0], "last": rss[-1], "max": max(rss),
                            "by_tenth": tenths, "by_cycle": by_cycle},
                 "fds": {"first": fds[0], "after_warmup": base[1], "last": fds[-1], "max": max(fds)},
                 "samples": len(live), "died": dead}
        # Tolerance: growth after warm-up up to 1.5x + 32 MB of RSS, + 64 fds.
        if rss[-1] > base[0] * 1.5 + 32 * 1024:
            failures.append(f"{kind} {name}: RSS {base[0]} kB after warm-up -> {rss[-1]} kB")
        if kind == "serve" and args.flat_mb is not None and by_cycle:
            worst = max(by_cycle[1:], default=by_cycle[0])
            if worst > by_cycle[0] + args.flat_mb * 1024:
                failures.append(f"{kind} {name}: RSS {by_cycle[0]} kB after the first fault cycle -> {worst} kB")
        if fds[-1] > base[1] + 64:
            failures.append(f"{kind} {name}: fds {base[1]} after warm-up -> {fds[-1]}")
        proc_report[f"{kind} {name}"] = entry

    reloads = collections.Counter()
    with open(args.reloads) as f:
        for line in f:
            reloads[line.split()[1]] += 1
    if reloads["error"]:
        failures.append(f"{reloads['error']} reloads failed")
    if not reloads["ok"]:
        failures.append("no reload ran")

    answers = result["answers"]
    latency = {kind: {"n": len(v), "p50_ms": 1000 * percentile(v, 50), "p99_ms": 1000 * percentile(v, 99),
                      "max_ms": 1000 * max(v)} for kind, v in result["latency"].items() if v}
    for kind in ("hot", "warm", "churn", "h2", "ws", "ws-frame", "ws-long-frame"):
        if not answers.get(kind):
            failures.append(f"no answers for {kind}")
    # No request may fail outright: no connection error, no 5xx (the store's
    # faults are the fallback's to answer), no long tunnel dropped (each
    # instance's is opened once).
    for kind, counts in answers.items():
        broken = {k: n for k, n in counts.items() if k.startswith("conn:") or k[:1] == "5"}
        if broken:
            failures.append(f"{kind}: {broken}")
    opened = sum(n for k, n in answers.get("ws-long", {}).items() if not k.startswith("conn:"))
    if opened > result["instances"]:
        failures.append(f"ws-long: {opened} tunnels opened for {result['instances']} instances: one was dropped")

    print(f"soak: {secs:.0f} s, {result['instances']} instances")
    print("\nfaults:")
    for s, e, what in faults:
        print(f"  +{s - result['started']:.1f}s .. +{e - result['started']:.1f}s  {what}")
    print(f"reloads: {dict(reloads)}")
    print("\nprocesses (RSS MB first / after warm-up / last / max; fds first / after warm-up / last / max):")
    for name, e in proc_report.items():
        r, d = e["rss_kb"], e["fds"]
        print(f"  {name:14} {r['first'] / 1024:6.1f} {r['after_warmup'] / 1024:6.1f} {r['last'] / 1024:6.1f}"
              f" {r['max'] / 1024:6.1f}   {d['first']:4} {d['after_warmup']:4} {d['last']:4} {d['max']:4}"
              + ("  DIED" if e["died"] else ""))
    print("\nserve RSS (MB) at each tenth of the run:")
    for name, e in proc_report.items():
        if name.startswith("serve"):
            print(f"  {name:14} " + " ".join(f"{r / 1024:.1f}" for r in e["rss_kb"]["by_tenth"]))
    print("\nserve RSS (MB) at the end of each fault cycle:")
    for name, e in proc_report.items():
        if name.startswith("serve"):
            print(f"  {name:14} " + " ".join(f"{r / 1024:.1f}" for r in e["rss_kb"]["by_cycle"]))
    print("\nanswers by client kind, and latency (ms):")
    for kind in sorted(answers):
        lat = latency.get(kind, {})
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(answers[kind].items()))
        p = f"p50 {lat['p50_ms']:.1f}, p99 {lat['p99_ms']:.1f}, max {lat['max_ms']:.1f}" if lat else ""
        print(f"  {kind:14} {counts}  |  {p}")
    print("\noracle (admissions certainly within one window, per identity; bound = limit,"
          "\n        or limit + N*floor(limit/N) in windows a fault or a fallback decision touched,"
          "\n        and limit more in windows a killed master touched):")
    for rule, v in verdicts.items():
        print(f"  {rule:6} limit {v['limit']} per {v['window_ms']} ms (bound when touched {v['bound_when_touched']},"
              f" killed {v['bound_when_killed']}):"
              f" {v['identities']} identities, {v['windows']} windows, {v['admitted']} admitted, {v['denied']} denied;"
              f" max {v['max_in_a_window']} in a window; over limit: {v['windows_over_limit_touched']} touched,"
              f" {v['windows_over_limit_clear']} clear; beyond bound: {v['windows_beyond_bound']}")
    print("\nverdict: " + ("FAIL\n  " + "\n  ".join(failures) if failures else "ok"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": secs, "faults": faults, "reloads": reloads, "processes": proc_report,
                       "answers": answers, "latency": latency, "oracle": verdicts, "failures": failures}, f, indent=1)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("rules")
    p = sub.add_parser("load")
    p.add_argument("--ports", required=True)
    p.add_argument("--secs", type=float, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("report")
    for name in ("load", "samples", "faults", "reloads", "cycles"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--flat-mb", type=float)
    p.add_argument("--json")
    args = parser.parse_args()
    if args.command == "rules":
        print(rules_toml())
    elif args.command == "load":
        load(args)
    else:
        sys.exit(report(args))


if __name__ == "__main__":
    main()
