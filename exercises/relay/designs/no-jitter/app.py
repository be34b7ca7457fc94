"""Orders relay, design `no-jitter` (BROKEN): the pauses grow, but every client's are the same.

Standard library only (ThreadingHTTPServer + urllib). Client key unchanged, answers passed up
whole, 4 attempts in one 3 s deadline, 504 with JSON at the end. THE FLAW is in `PAUSES`: fixed
exponential pauses of 0.1, 0.2 and 0.4 s, with no random part, so clients that failed together
retry together.
"""

import json
import os
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAYMENTS = os.environ["PAYMENTS_URL"].rstrip("/") + "/payments"
DEADLINE = 3.0
PER_CALL = 1.0
PAUSES = [0.1, 0.2, 0.4]  # THE FLAW: no jitter
GIVE_UP = 504, {}, json.dumps({"error": "upstream_unavailable",
                               "message": "outcome unknown; retry with the same key"}).encode()


def send_down(body, key, timeout):
    req = urllib.request.Request(PAYMENTS, data=body, method="POST",
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()
    except OSError:  # URLError, timeouts, resets
        return None


def relay(body, key):
    start = time.monotonic()
    for pause in PAUSES + [None]:
        left = DEADLINE - (time.monotonic() - start)
        if left <= 0:
            break
        got = send_down(body, key, min(PER_CALL, left))
        if got and got[0] not in (502, 503, 504):
            return got
        if pause is None or time.monotonic() - start + pause >= DEADLINE:
            break
        time.sleep(pause)
    return GIVE_UP


class Relay(BaseHTTPRequestHandler):
    def reply(self, status, headers, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for h in ("Retry-After", "Idempotent-Replayed"):
            if h in headers:
                self.send_header(h, headers[h])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(200, {}, b'{"status":"ok"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(*relay(body, self.headers["Idempotency-Key"]))

    def log_message(self, *_):
        pass


ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Relay).serve_forever()
