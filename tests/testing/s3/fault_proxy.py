"""A fault-injecting HTTP/1.1 proxy for the S3 tests (standard library only).

It stands between a client and an S3 server (moto_server.py) on loopback and
forwards every request unchanged (the Host header too, so signatures stay
valid), except the requests that match one of its rules, which it answers
badly:

    status    answer at once with an S3 error (say 503 SlowDown), without
              forwarding
    delay     forward, then hold the answer `seconds` before sending it
              (the server has acted; the client may time out)
    truncate  forward, send the headers (with the full Content-Length) and
              only `keep_bytes` of the body, then close the connection
    reset     forward, then close the connection without any answer
    flip      forward, and flip the bits of the body byte at `offset`

    fault_proxy.py --upstream http://127.0.0.1:PORT

prints {"endpoint": "http://127.0.0.1:PORT", "pid": N} on one line and
serves until stdin is closed. Rules are set and read over HTTP on the same
port (these requests are never forwarded):

    PUT /__faults__   a JSON list of rules (replaces the rules)
    GET /__faults__   the rules, each with "hits": how often it fired

A rule: {"action": ..., "method": "GET" (or null: any), "path": a regular
expression searched in the request's path and query (or null: any),
"skip": N (let the first N matching requests through), "times": N (then
fire N times; null: always), and the action's own fields: "status",
"code", "message"; "seconds"; "keep_bytes"; "offset"}. The first rule that
matches a request and still has to fire decides.
"""
import argparse
import http.client
import http.server
import json
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse

_CONTROL = "/__faults__"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te",
               "trailer", "upgrade", "proxy-connection", "content-length"}


class Rules:
    def __init__(self):
        self._lock = threading.Lock()
        self._rules = []

    def set(self, rules):
        for r in rules:
            r.setdefault("skip", 0)
            r.setdefault("times", 1)
            r["hits"] = 0
            r["_seen"] = 0
        with self._lock:
            self._rules = rules

    def get(self):
        with self._lock:
            return [{k: v for k, v in r.items() if not k.startswith("_")}
                    for r in self._rules]

    def match(self, method, target):
        """The rule that fires for this request, or None."""
        with self._lock:
            for r in self._rules:
                if r.get("method") and r["method"] != method:
                    continue
                if r.get("path") and not re.search(r["path"], target):
                    continue
                r["_seen"] += 1
                if r["_seen"] <= r["skip"]:
                    continue
                if r["times"] is not None and r["hits"] >= r["times"]:
                    continue
                r["hits"] += 1
                return dict(r)
        return None


def make_handler(upstream, rules):
    up = urllib.parse.urlsplit(upstream)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _send(self, status, headers, body, keep=None):
            self.send_response_only(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body if keep is None else body[:keep])
            self.wfile.flush()

        def _hang_up(self, reset):
            self.close_connection = True
            if reset:  # RST rather than FIN
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER,
                    struct.pack("ii", 1, 0))
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _control(self):
            if self.command == "PUT":
                rules.set(json.loads(self._body()))
                self._send(200, [], b"{}")
            else:
                self._send(200, [("Content-Type", "application/json")],
                           json.dumps(rules.get()).encode())

        def _forward(self, body):
            conn = http.client.HTTPConnection(up.hostname, up.port,
                                              timeout=120)
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = b"" if self.command == "HEAD" else resp.read()
            out = [(k, v) for k, v in resp.getheaders()
                   if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":
                cl = resp.getheader("Content-Length")
                conn.close()
                return resp.status, out, data, cl
            conn.close()
            return resp.status, out, data, None

        def _handle(self):
            if self.path.startswith(_CONTROL):
                return self._control()
            body = self._body()
            rule = rules.match(self.command, self.path)
            action = rule["action"] if rule else None
            if action == "status":
                code = rule.get("code", "InternalError")
                msg = rule.get("message", "injected by fault_proxy.py")
                xml = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
                       f"<Code>{code}</Code><Message>{msg}</Message>"
                       f"<RequestId>fault-proxy</RequestId></Error>").encode()
                return self._send(rule.get("status", 500),
                                  [("Content-Type", "application/xml")], xml)
            status, headers, data, head_length = self._forward(body)
            if action == "delay":
                time.sleep(rule.get("seconds", 1.0))
            elif action == "reset":
                return self._hang_up(reset=True)
            elif action == "flip" and data:
                i = min(rule.get("offset", 0), len(data) - 1)
                data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
            if head_length is not None:
                # HEAD: the object's size as the server gave it, no body.
                self.send_response_only(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", head_length)
                self.end_headers()
                self.wfile.flush()
                return
            if action == "truncate":
                self._send(status, headers, data,
                           keep=min(rule.get("keep_bytes", 0), len(data)))
                return self._hang_up(reset=False)
            self._send(status, headers, data)

        def _serve_one(self):
            try:
                self._handle()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (timeout)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve_one

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True)
    args = ap.parse_args()
    rules = Rules()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             make_handler(args.upstream, rules))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    print(json.dumps({"endpoint": f"http://{host}:{port}",
                      "pid": os.getpid()}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin (or dies)
    os._exit(0)  # at once: no wait for held answers (delay) to end


if __name__ == "__main__":
    main()
