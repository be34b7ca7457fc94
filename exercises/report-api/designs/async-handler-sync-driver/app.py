"""Report service, ON CONFLICT design in an async handler with a blocking driver (correct).

INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING id; no row back: SELECT the stored
report and compare its payload hash (200 replay, or 409). The handler is `async def` but calls
synchronous psycopg, a common first FastAPI service: while one request waits on PostgreSQL the
event loop waits too, so the process serves one request at a time. Slow, but every invariant holds,
and it would hold as well with several processes: the UNIQUE index decides.
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
async def health():
    return {"status": "ok"}


@app.post("/reports")
async def create_report(body: ReportIn, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is not None and not 1 <= len(idempotency_key.strip()) <= 255:
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    digest = hashlib.sha256(f"{body.task_id}:{body.report_type}".encode()).hexdigest()
    with psycopg.connect(DATABASE_URL) as conn:  # blocking, inside the event loop
        row = conn.execute(
            "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            (body.task_id, body.report_type, idempotency_key, digest),
        ).fetchone()
        if row:
            return JSONResponse({"report_id": row[0], "replayed": False}, status_code=201)
        stored_id, stored_hash = conn.execute(
            "SELECT id, payload_hash FROM reports WHERE idempotency_key = %s", (idempotency_key,)
        ).fetchone()
    if stored_hash != digest:
        return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
    return JSONResponse({"report_id": stored_id, "replayed": True}, status_code=200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
