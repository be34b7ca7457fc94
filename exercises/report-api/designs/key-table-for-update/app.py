"""Report service, key-table design (correct).

The keys live in a table of the service's own, idempotency_keys(key PRIMARY KEY, fingerprint,
report_id), created at start-up. In one transaction: INSERT the key row ON CONFLICT DO NOTHING
(a row back: this request owns the key), lock it with SELECT ... FOR UPDATE, and only the owner
inserts the report and writes its id into the key row. A second request waits on the key row until
the owner commits, then replays (same fingerprint) or answers 409. reports.idempotency_key stays
NULL: the key is this service's bookkeeping, not a column of the report.
"""

import hashlib
import os
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import create_engine, text

engine = create_engine(os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1))


@asynccontextmanager
async def lifespan(app: FastAPI):
    with engine.begin() as conn:  # the service's own table, made at start-up
        conn.execute(text(
            "CREATE TABLE IF NOT EXISTS idempotency_keys ("
            " key text PRIMARY KEY,"
            " fingerprint text NOT NULL,"
            " report_id bigint)"
        ))
    yield


app = FastAPI(lifespan=lifespan)


class ReportIn(BaseModel):
    task_id: int = Field(gt=0, le=9223372036854775807)
    report_type: str = Field(min_length=1, max_length=64, pattern=r"^[\x20-\x7e]+$")


def insert_report(conn, body: ReportIn, fingerprint: str) -> int:
    return conn.execute(
        text("INSERT INTO reports (task_id, report_type, payload_hash) VALUES (:t, :r, :f) RETURNING id"),
        {"t": body.task_id, "r": body.report_type, "f": fingerprint},
    ).scalar_one()


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(body: ReportIn, idempotency_key: str | None = Header(default=None)):
    key = idempotency_key.strip() if idempotency_key is not None else None
    if key is not None and not 1 <= len(key) <= 255:
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    fingerprint = hashlib.sha256(f"{body.task_id}:{body.report_type}".encode()).hexdigest()
    with engine.begin() as conn:
        if key is None:
            return JSONResponse({"report_id": insert_report(conn, body, fingerprint), "replayed": False}, 201)
        owner = conn.execute(
            text("INSERT INTO idempotency_keys (key, fingerprint) VALUES (:k, :f)"
                 " ON CONFLICT (key) DO NOTHING RETURNING key"),
            {"k": key, "f": fingerprint},
        ).first() is not None
        row = conn.execute(
            text("SELECT fingerprint, report_id FROM idempotency_keys WHERE key = :k FOR UPDATE"), {"k": key}
        ).one()
        if owner:
            report_id = insert_report(conn, body, fingerprint)
            conn.execute(text("UPDATE idempotency_keys SET report_id = :id WHERE key = :k"), {"id": report_id, "k": key})
            return JSONResponse({"report_id": report_id, "replayed": False}, 201)
    if row.fingerprint != fingerprint:
        return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
    return JSONResponse({"report_id": row.report_id, "replayed": True}, 200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
