#!/usr/bin/env python3
# The soak harness's upstream (scripts/soak.sh): answers every request 200
# "ok" at once, over HTTP/1.1 keep-alive, and echoes WebSocket frames after
# an `Upgrade: websocket` handshake. Loopback only; stdlib only.
# Usage: scripts/soak-upstream.py PORT
import base64, hashlib, socketserver, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def read_exact(f, n):
    data = f.read(n)
    if data is None or len(data) < n:
        raise ConnectionError("closed mid-frame")
    return data


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without TCP_NODELAY the second waits
    # for the proxy's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("upgrade", "").lower() == "websocket":
            return self.websocket()
        self.answer()

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.answer()

    def answer(self):
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def websocket(self):
        key = self.headers.get("sec-websocket-key", "").encode()
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest()).decode()
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        try:
            while True:
                head = read_exact(self.rfile, 2)
                opcode, masked, length = head[0] & 0x0F, head[1] & 0x80, head[1] & 0x7F
                if length == 126:
                    length = int.from_bytes(read_exact(self.rfile, 2), "big")
                elif length == 127:
                    length = int.from_bytes(read_exact(self.rfile, 8), "big")
                mask = read_exact(self.rfile, 4) if masked else b"\0\0\0\0"
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exact(self.rfile, length)))
                if opcode == 0x8:  # close: answer it, then end the tunnel
                    self.wfile.write(bytes([0x88, len(payload)]) + payload)
                    return
                # Server frames are not masked; payloads here stay under 126 bytes.
                self.wfile.write(bytes([0x80 | opcode, len(payload)]) + payload)
                self.wfile.flush()
        except (ConnectionError, OSError):
            return


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


if __name__ == "__main__":
    socketserver.TCPServer.allow_reuse_address = True
    Server(("127.0.0.1", int(sys.argv[1])), Upstream).serve_forever()
