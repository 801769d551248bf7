"""A fault-injecting HTTP proxy between an S3 client and a server, both on 127.0.0.1.

Each request is read whole, then (each kind of fault once first, then by a seeded random draw):
  - answered 503 SlowDown without reaching the server (rate `slowdown`),
  - answered 500 InternalError (rate `internal`),
  - cut off: the connection is reset before any answer (rate `reset`),
  - forwarded with one byte of its body flipped, so the server's CRC32C check refuses it
    (rate `corrupt`, PUT bodies only),
  - stalled: held without a byte of answer for `stall_seconds`, then cut off (rate `stall`),
  - refused as if the store were full: 507 XMinioStorageFull (rate `full`, writes only: PUT and
    POST),
  - forwarded, and the server's answer lost: the connection is reset instead (rate `lost`,
    completions of multipart uploads only: the server did it, the client does not know),
  - or forwarded unchanged (the Host header and everything signed pass through as sent).
`counts` says how many of each happened. One request per connection (the proxy closes it after
answering), so the client's connection reuse is exercised by the reconnects instead.
"""

import http.client
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FaultProxy:
    ANSWERS = {"slowdown": (503, "SlowDown"), "internal": (500, "InternalError"),
               "full": (507, "XMinioStorageFull")}

    def __init__(self, upstream_port, seed, slowdown=0.0, internal=0.0, reset=0.0, corrupt=0.0,
                 stall=0.0, full=0.0, lost=0.0, stall_seconds=5.0):
        self.upstream_port = upstream_port
        self.rates = {"slowdown": slowdown, "internal": internal, "reset": reset,
                      "corrupt": corrupt, "stall": stall, "full": full, "lost": lost}
        self.stall_seconds = stall_seconds
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, **{kind: 0 for kind in self.rates}}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._draw(self.command, self.path, body)
                if fault == "stall":
                    time.sleep(proxy.stall_seconds)
                if fault in ("reset", "stall"):
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if fault in proxy.ANSWERS:
                    code, status = proxy.ANSWERS[fault]
                    doc = (f"<?xml version=\"1.0\"?><Error><Code>{status}</Code>"
                           f"<Message>injected by the test proxy</Message></Error>").encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(doc)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(doc)
                    self.close_connection = True
                    return
                if fault == "corrupt":
                    i = len(body) // 2
                    body = body[:i] + bytes([body[i] ^ 0x01]) + body[i + 1:]
                self._forward(body, answer=fault != "lost")

            def _forward(self, body, answer=True):
                up = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    up.putheader(k, v)
                up.endheaders(body if body else None)
                resp = up.getresponse()
                data = resp.read()
                if not answer:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.close_connection = True
                    up.close()
                    return
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                self.close_connection = True
                up.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _draw(self, method, path, body):
        """The fault for one request: each kind once first (so every run sees all of them; damage
        on the first PUT with a body), then by the seeded draw."""
        with self.lock:
            fault = None
            writing = method in ("PUT", "POST")
            completing = method == "POST" and "uploadId=" in path

            def applies(kind):
                return ((kind != "full" or writing) and (kind != "lost" or completing)
                        and (kind != "corrupt" or (method == "PUT" and bool(body))))

            for kind in ("slowdown", "internal", "reset", "stall", "full", "lost"):
                if self.rates[kind] > 0 and self.counts[kind] == 0 and applies(kind):
                    fault = kind
                    break
            putting = method == "PUT" and bool(body)
            if fault is None and putting and self.rates["corrupt"] > 0 and not self.counts["corrupt"]:
                fault = "corrupt"
            if fault is None:
                x, acc = self.random.random(), 0.0
                for kind, rate in self.rates.items():
                    acc += rate
                    if x < acc:  # this kind, when it applies to this request
                        fault = kind if applies(kind) else None
                        break
            self.counts[fault or "forwarded"] += 1
            return fault

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def main():
    """python3 fault_proxy.py UPSTREAM_PORT SEED SLOWDOWN INTERNAL RESET CORRUPT [STALL FULL LOST
    [STALL_SECONDS]]: prints {"port": P}, proxies until stdin closes, then prints the counts as
    JSON."""
    import json
    import sys
    up, seed, *rates = sys.argv[1:]
    with FaultProxy(int(up), int(seed), *map(float, rates)) as proxy:
        print(json.dumps({"port": proxy.port}), flush=True)
        sys.stdin.read()
    print(json.dumps(proxy.counts), flush=True)


if __name__ == "__main__":
    main()
