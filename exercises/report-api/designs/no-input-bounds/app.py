"""Report service, ON CONFLICT design that checks types but not bounds (BROKEN: input rules).

Deduplication is right (INSERT ... ON CONFLICT (idempotency_key) DO NOTHING, then a SELECT and a
fingerprint comparison), and nothing reaches PostgreSQL that it would refuse (task_id within
bigint, no NUL byte). The flaw is in ReportIn: task_id may be zero or negative and report_type
may be empty or any length, so requests the contract calls malformed (a positive task_id, a
report_type of 1 to 64 printable characters) are stored and answered 201 instead of a 4xx.
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
    # FLAW: no gt=0 on task_id, no length or printable rule on report_type.
    task_id: int = Field(ge=-(2**63), le=2**63 - 1)
    report_type: str = Field(pattern=r"^[^\x00]*$")


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(body: ReportIn, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is not None and not 1 <= len(idempotency_key.strip()) <= 255:
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    digest = hashlib.sha256(f"{body.task_id}:{body.report_type}".encode()).hexdigest()
    with psycopg.connect(DATABASE_URL) as conn:
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
