"""Report service, ON CONFLICT design with plain-text errors (BROKEN: error bodies).

Deduplication is right: INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, then a
SELECT of the stored report and a fingerprint comparison. The flaw is in the two refusals: the
400 for an invalid key and the 409 for a reused key answer with PlainTextResponse, where the
contract asks for a JSON body (a client parsing the error gets nothing).
"""

import hashlib
import os

import psycopg
import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, PlainTextResponse
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
        return PlainTextResponse("invalid Idempotency-Key", status_code=400)  # FLAW: not JSON
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
        return PlainTextResponse("Idempotency-Key reused with another request", status_code=409)  # FLAW: not JSON
    return JSONResponse({"report_id": stored_id, "replayed": True}, status_code=200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
