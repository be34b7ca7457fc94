"""Report service that remembers its keys in memory (BROKEN across a restart).

A dict maps each Idempotency-Key to (fingerprint, report_id); one lock makes check, insert and
remember one step, so concurrent requests in this process are safe. The flaw is KEYS itself: it
lives in the process, not in the database next to the report. Killed after the COMMIT and started
again, the service has forgotten the key, and the client's retry inserts a second report.
"""

import hashlib
import os
import threading

import psycopg
import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

DATABASE_URL = os.environ["DATABASE_URL"]
app = FastAPI()

KEYS: dict[str, tuple[str, int]] = {}  # FLAW: gone when the process is
KEYS_LOCK = threading.Lock()


class ReportIn(BaseModel):
    task_id: int = Field(gt=0, le=2**63 - 1)
    report_type: str = Field(min_length=1, max_length=64, pattern=r"^[\x20-\x7e]+$")


def insert_report(body: ReportIn, fingerprint: str) -> int:
    with psycopg.connect(DATABASE_URL) as conn:
        return conn.execute(
            "INSERT INTO reports (task_id, report_type, payload_hash) VALUES (%s, %s, %s) RETURNING id",
            (body.task_id, body.report_type, fingerprint),
        ).fetchone()[0]


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(body: ReportIn, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is not None and not 1 <= len(idempotency_key.strip()) <= 255:
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    fingerprint = hashlib.sha256(f"{body.task_id}:{body.report_type}".encode()).hexdigest()
    if idempotency_key is None:
        return JSONResponse({"report_id": insert_report(body, fingerprint), "replayed": False}, status_code=201)
    with KEYS_LOCK:
        stored = KEYS.get(idempotency_key)
        if stored is None:
            report_id = insert_report(body, fingerprint)
            KEYS[idempotency_key] = (fingerprint, report_id)
            return JSONResponse({"report_id": report_id, "replayed": False}, status_code=201)
    if stored[0] != fingerprint:
        return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
    return JSONResponse({"report_id": stored[1], "replayed": True}, status_code=200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
