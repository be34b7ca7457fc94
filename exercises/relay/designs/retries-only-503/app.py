"""Orders relay, design `retries-only-503` (BROKEN): 502 and 504 from below are not retried.

Standard library only (ThreadingHTTPServer + urllib). Client key unchanged, answers passed up
whole, 4 attempts with equal-jitter backoff in one 3 s deadline, 504 with JSON at the end. THE
FLAW is `RETRYABLE = {503}`: "only Service Unavailable is temporary", so a 502 or a 504 (a
gateway in front of the payment service whose call below got no answer: the outcome unknown)
goes straight up instead of being retried with the same key.
"""

import json
import os
import random
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAYMENTS = os.environ["PAYMENTS_URL"].rstrip("/") + "/payments"
DEADLINE, ATTEMPTS, PER_CALL, BASE = 3.0, 4, 1.0, 0.1
RETRYABLE = {503}  # THE FLAW: 502 and 504 belong here too


def once(body, key, timeout):
    req = urllib.request.Request(PAYMENTS, data=body, method="POST",
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()
    except OSError:
        return None


def relay(body, key):
    t0 = time.monotonic()
    for n in range(1, ATTEMPTS + 1):
        left = DEADLINE - (time.monotonic() - t0)
        if left <= 0:
            break
        got = once(body, key, min(PER_CALL, left))
        if got is not None and got[0] not in RETRYABLE:
            return got
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            time.sleep(max(0.0, min(random.uniform(c / 2, c), DEADLINE - (time.monotonic() - t0))))
    return 504, {}, json.dumps({"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"}).encode()


class Handler(BaseHTTPRequestHandler):
    def send(self, status, headers, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for h in ("Retry-After", "Idempotent-Replayed"):
            if headers.get(h):
                self.send_header(h, headers[h])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send(200, {}, b'{"status":"ok"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send(*relay(body, self.headers.get("Idempotency-Key", "")))

    def log_message(self, *_):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
