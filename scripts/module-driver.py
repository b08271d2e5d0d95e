#!/usr/bin/env python3
"""Pipelined calls of one kind against one loopback redis-server, for
scripts/bench-module.sh (BENCHMARKS.md, "Native Redis module").

usage: module-driver.py PORT KIND N
  KIND  swc | fw   SLIDEGATE.DECIDE, 100 per 60 s, client time mid-window,
                   keys slidegate:{api:k:<32 hex>}:<alg>:100:60000
        script     the article's script (crates/slidegate-cli/src/reference_script.lua)
                   by EVALSHA on the same identities
Identity i is the same in every run, so a second run over the same N
updates the keys the first created (same window)."""
import hashlib
import os
import socket
import struct
import sys

NOW = 1_700_000_030_000  # mid-window for 60 s windows
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "crates", "slidegate-cli", "src", "reference_script.lua")


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def identity(i):
    return "api:k:" + hashlib.blake2b(b"%d" % i, digest_size=16).hexdigest()


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def reply(self):
        """One reply (status, error, integer or bulk string)."""
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                kind, line = self.buf[:1], self.buf[1:end]
                if kind != b"$" or int(line) < 0:
                    self.buf = self.buf[end + 2:]
                    if kind == b"-":
                        sys.exit("redis error: " + line.decode())
                    return line
                n = int(line)
                if len(self.buf) >= end + 2 + n + 2:
                    body = self.buf[end + 2:end + 2 + n]
                    self.buf = self.buf[end + 2 + n + 2:]
                    return body
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                sys.exit("connection closed")
            self.buf += chunk

    def pipeline(self, commands):
        self.sock.sendall(b"".join(commands))
        for _ in commands:
            self.reply()


def main():
    port, kind, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    conn = Conn(port)
    if kind == "script":
        with open(SCRIPT, "rb") as f:
            conn.sock.sendall(resp("SCRIPT", "LOAD", f.read()))
            sha = conn.reply().decode()
    batch = []
    for i in range(n):
        if kind in ("swc", "fw"):
            algorithm = 1.0 if kind == "swc" else 2.0
            args = struct.pack("<5d", float(NOW), algorithm, 100.0, 60000.0, 1.0)
            key = "slidegate:{%s}:%s:100:60000" % (identity(i), kind)
            batch.append(resp("SLIDEGATE.DECIDE", key, args))
        elif kind == "script":
            batch.append(resp("EVALSHA", sha, "1", "slidegate:{%s}" % identity(i), str(NOW), "60000", "100"))
        else:
            sys.exit("KIND is swc, fw or script")
        if len(batch) == 100:
            conn.pipeline(batch)
            batch = []
    if batch:
        conn.pipeline(batch)


main()
