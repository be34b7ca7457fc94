"""Report service, advisory-lock design (correct).

Each keyed request runs in one transaction that first takes
pg_advisory_xact_lock(hashtextextended(key, 0)): requests with the same key queue there, one at a
time, until the holder commits. Under that lock a plain SELECT, then INSERT, is safe: the second
request's SELECT sees the first one's committed report. SQLAlchemy Core, as in the starter.
"""

import hashlib
import json
import os

import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import create_engine, text

engine = create_engine(
    os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1),
    pool_size=10,
    max_overflow=10,
)
app = FastAPI()

INSERT = text(
    "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash)"
    " VALUES (:task_id, :report_type, :key, :hash) RETURNING id"
)


class NewReport(BaseModel):
    task_id: int = Field(gt=0, lt=2**63)
    report_type: str = Field(min_length=1, max_length=64, pattern=r"^[ -~]+$")


def problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(report: NewReport, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is not None:
        idempotency_key = idempotency_key.strip()
        if not idempotency_key or len(idempotency_key) > 255:
            return problem(400, "Idempotency-Key must be 1 to 255 characters")
    digest = hashlib.sha256(json.dumps(report.model_dump(), sort_keys=True).encode()).hexdigest()
    params = {**report.model_dump(), "key": idempotency_key, "hash": digest}
    with engine.begin() as conn:
        if idempotency_key is None:
            return JSONResponse({"report_id": conn.execute(INSERT, params).scalar_one(), "replayed": False}, 201)
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), params)
        stored = conn.execute(
            text("SELECT id, payload_hash FROM reports WHERE idempotency_key = :key"), params
        ).first()
        if stored is None:
            return JSONResponse({"report_id": conn.execute(INSERT, params).scalar_one(), "replayed": False}, 201)
    if stored.payload_hash != digest:
        return problem(409, "Idempotency-Key already used with a different request")
    return JSONResponse({"report_id": stored.id, "replayed": True}, 200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
