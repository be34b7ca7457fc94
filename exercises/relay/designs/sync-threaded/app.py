"""Orders relay, design `sync-threaded` (correct): no framework, no asyncio.

http.server's ThreadingHTTPServer gives each payment a thread; urllib makes the blocking calls
down with the client's Idempotency-Key. Up to 4 attempts within one 3 s deadline, each with a
socket timeout of min(1 s, time left); between them equal jitter, uniform(c/2, c) with
c = 0.15 * 2**(n-1). Any answer but 502/503/504 goes up with its status, body, Retry-After and
Idempotent-Replayed; giving up is a 504 with a JSON body.
"""

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAYMENTS = os.environ["PAYMENTS_URL"].rstrip("/") + "/payments"
DEADLINE = 3.0
ATTEMPTS = 4
PER_CALL = 1.0
BASE = 0.15
RETRY_STATUSES = (502, 503, 504)
PASSED_HEADERS = ("Retry-After", "Idempotent-Replayed")


def call_down(body: bytes, key: str, timeout: float):
    """One attempt: (status, headers, body), or None when no answer came."""
    request = urllib.request.Request(
        PAYMENTS, data=body, method="POST",
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as refused:  # a 4xx/5xx is still an answer
        with refused:
            return refused.code, refused.headers, refused.read()
    except (urllib.error.URLError, OSError, socket.timeout):
        return None


def relay(body: bytes, key: str):
    started = time.monotonic()
    for n in range(1, ATTEMPTS + 1):
        left = DEADLINE - (time.monotonic() - started)
        if left <= 0:
            break
        got = call_down(body, key, min(PER_CALL, left))
        if got is not None and got[0] not in RETRY_STATUSES:
            return got
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            left = DEADLINE - (time.monotonic() - started)
            time.sleep(max(0.0, min(random.uniform(c / 2, c), left)))
    message = {"error": "upstream_unavailable",
               "message": "the payment service gave no usable answer in time; the payment may or may not have happened; retry with the same key"}
    return 504, {}, json.dumps(message).encode()


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, headers, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name in PASSED_HEADERS:
            if headers.get(name) is not None:
                self.send_header(name, headers[name])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.answer(200, {}, b'{"status":"ok"}')
        else:
            self.answer(404, {}, b'{"error":"not_found"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/orders/pay":
            return self.answer(404, {}, b'{"error":"not_found"}')
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self.answer(400, {}, b'{"error":"missing_idempotency_key"}')
        self.answer(*relay(body, key))

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8000"))), Handler)
    server.daemon_threads = True
    server.serve_forever()
