"""Report service, ON CONFLICT design with a partial fingerprint (BROKEN: misses a 409).

Keys are deduplicated correctly (INSERT ... ON CONFLICT (idempotency_key) DO NOTHING, then a
SELECT of the stored report). The flaw is in fingerprint(): it hashes report_type only, so the
same key sent again with another task_id looks like a retry and gets 200 with the first task's
report, where the contract says 409.
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


def fingerprint(body: ReportIn) -> str:
    # FLAW: task_id is left out; only the report type is compared on a replay.
    return hashlib.sha256(body.report_type.encode()).hexdigest()


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(body: ReportIn, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is not None and not 1 <= len(idempotency_key.strip()) <= 255:
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    fp = fingerprint(body)
    with psycopg.connect(DATABASE_URL) as conn:
        row = conn.execute(
            "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            (body.task_id, body.report_type, idempotency_key, fp),
        ).fetchone()
        if row:
            return JSONResponse({"report_id": row[0], "replayed": False}, status_code=201)
        stored_id, stored_fp = conn.execute(
            "SELECT id, payload_hash FROM reports WHERE idempotency_key = %s", (idempotency_key,)
        ).fetchone()
    if stored_fp != fp:
        return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
    return JSONResponse({"report_id": stored_id, "replayed": True}, status_code=200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
