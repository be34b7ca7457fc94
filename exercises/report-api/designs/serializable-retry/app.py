"""Report service, SERIALIZABLE-and-retry design (correct), on the standard library's http.server.

Each request is one SERIALIZABLE transaction: SELECT the key's report, INSERT one if there is none.
Two requests that both find nothing cannot both commit: PostgreSQL aborts one with SQLSTATE 40001
(or 23505 from the UNIQUE index), and the whole transaction is run again, when its SELECT finds the
winner's report. A ThreadingHTTPServer, one psycopg connection per attempt.
"""

import hashlib
import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg import errors

DATABASE_URL = os.environ["DATABASE_URL"]
PRINTABLE = re.compile(r"[\x20-\x7e]{1,64}")
ATTEMPTS = 20


class BadRequest(Exception):
    pass


def parse(raw: bytes) -> tuple[int, str]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not JSON")
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    task_id, report_type = body.get("task_id"), body.get("report_type")
    if type(task_id) is not int or not 0 < task_id < 2**63:
        raise BadRequest("task_id must be a positive bigint")
    if not isinstance(report_type, str) or not PRINTABLE.fullmatch(report_type):
        raise BadRequest("report_type must be 1 to 64 printable characters")
    return task_id, report_type


def create(task_id: int, report_type: str, key: str | None) -> tuple[int, dict]:
    digest = hashlib.sha256(json.dumps([task_id, report_type]).encode()).hexdigest()
    for attempt in range(ATTEMPTS):
        try:
            with psycopg.connect(DATABASE_URL) as conn:
                conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
                with conn.transaction():
                    stored = None
                    if key is not None:
                        stored = conn.execute(
                            "SELECT id, payload_hash FROM reports WHERE idempotency_key = %s", (key,)
                        ).fetchone()
                    if stored is None:
                        (report_id,) = conn.execute(
                            "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash)"
                            " VALUES (%s, %s, %s, %s) RETURNING id",
                            (task_id, report_type, key, digest),
                        ).fetchone()
                        return 201, {"report_id": report_id, "replayed": False}
            if stored[1] != digest:
                return 409, {"error": "this Idempotency-Key was used with another request"}
            return 200, {"report_id": stored[0], "replayed": True}
        except (errors.SerializationFailure, errors.UniqueViolation):
            time.sleep(0.005 * (attempt + 1))  # the winner has committed: read again
    return 503, {"error": "too much contention, retry later"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.answer(200, {"status": "ok"})
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/reports":
            return self.answer(404, {"error": "not found"})
        key = self.headers.get("Idempotency-Key")
        if key is not None:
            key = key.strip()
            if not key or len(key) > 255:
                return self.answer(400, {"error": "Idempotency-Key must be 1 to 255 characters"})
        try:
            task_id, report_type = parse(raw)
        except BadRequest as e:
            return self.answer(422, {"error": str(e)})
        self.answer(*create(task_id, report_type, key))

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
