"""Report service, check-then-insert on a key table without UNIQUE (BROKEN under a race).

The keys live in request_keys(key, fingerprint, report_id), created at start-up, and the report
row leaves reports.idempotency_key NULL. A keyed request SELECTs its key; none found, it inserts
the report and then the key row. The flaw: request_keys has no UNIQUE/PRIMARY KEY on key and
nothing locks between the SELECT and the INSERTs, so two concurrent requests with one key both
find nothing and both insert: two reports, two 201s.
"""

import hashlib
import os

import psycopg
import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

DATABASE_URL = os.environ["DATABASE_URL"]
app = FastAPI()


class ReportIn(BaseModel):
    task_id: int = Field(gt=0, le=2**63 - 1)
    report_type: str = Field(min_length=1, max_length=64, pattern=r"^[\x20-\x7e]+$")


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(body: ReportIn, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is not None and not 1 <= len(idempotency_key.strip()) <= 255:
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    fingerprint = hashlib.sha256(f"{body.task_id}:{body.report_type}".encode()).hexdigest()
    with psycopg.connect(DATABASE_URL) as conn:
        if idempotency_key is not None:
            stored = conn.execute(
                "SELECT fingerprint, report_id FROM request_keys WHERE key = %s", (idempotency_key,)
            ).fetchone()
            if stored is not None:
                if stored[0] != fingerprint:
                    return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
                return JSONResponse({"report_id": stored[1], "replayed": True}, status_code=200)
        (report_id,) = conn.execute(
            "INSERT INTO reports (task_id, report_type, payload_hash) VALUES (%s, %s, %s) RETURNING id",
            (body.task_id, body.report_type, fingerprint),
        ).fetchone()
        if idempotency_key is not None:
            # FLAW: no UNIQUE on request_keys.key, no lock: a concurrent twin inserts too.
            conn.execute(
                "INSERT INTO request_keys (key, fingerprint, report_id) VALUES (%s, %s, %s)",
                (idempotency_key, fingerprint, report_id),
            )
    return JSONResponse({"report_id": report_id, "replayed": False}, status_code=201)


if __name__ == "__main__":
    with psycopg.connect(DATABASE_URL) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS request_keys (key text NOT NULL, fingerprint text NOT NULL, report_id bigint NOT NULL)")
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
