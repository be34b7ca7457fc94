"""Report service, SERIALIZABLE without retry (BROKEN under a race).

Each request is one SERIALIZABLE transaction (SQLAlchemy's isolation_level): SELECT the key's
report, INSERT one when there is none. PostgreSQL keeps the two racing requests from both
committing, but the flaw is that create_report never retries: the loser's serialization failure
(SQLSTATE 40001) propagates, and that client gets a 500 instead of the winner's report.
"""

import hashlib
import os

import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import create_engine, text

engine = create_engine(
    os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1),
    isolation_level="SERIALIZABLE",
)
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
    digest = hashlib.sha256(f"{body.task_id}:{body.report_type}".encode()).hexdigest()
    # FLAW: one attempt only; a 40001 (or 23505) from a concurrent twin becomes a 500.
    with engine.begin() as conn:
        if idempotency_key is not None:
            stored = conn.execute(
                text("SELECT id, payload_hash FROM reports WHERE idempotency_key = :k"), {"k": idempotency_key}
            ).first()
            if stored is not None:
                if stored.payload_hash != digest:
                    return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
                return JSONResponse({"report_id": stored.id, "replayed": True}, status_code=200)
        report_id = conn.execute(
            text("INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash)"
                 " VALUES (:t, :r, :k, :h) RETURNING id"),
            {"t": body.task_id, "r": body.report_type, "k": idempotency_key, "h": digest},
        ).scalar_one()
    return JSONResponse({"report_id": report_id, "replayed": False}, status_code=201)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
