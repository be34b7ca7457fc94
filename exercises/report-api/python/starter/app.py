"""The report service of lesson 6 (§4 and §8): POST /reports with an Idempotency-Key.

What it must promise (the contract `lab exercise check report-api` tests):

    new key                   201 {"report_id": N, "replayed": false}
    same key, same content    200 {"report_id": N, "replayed": true}   (same N)
    same key, other content   409 {"error": "idempotency_key_reused", ...}
    no key                    201, a new report every time
    an empty or too long key  400 {"error": "invalid_idempotency_key", ...}

As it is, it creates a report for every request and ignores the key: a client that retries after
a lost answer gets a second report. The two TODOs below are the lesson.

Run it alone:  PORT=8000 DATABASE_URL=postgresql://... .venv/bin/python app.py
"""

import hashlib
import json
import os

import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import create_engine, text

# The lab gives a plain postgresql:// URL (sqlx and psql read it as it is); SQLAlchemy needs the
# driver in the scheme. The URL's `options` carry the run's search_path: the tables of
# schema.sql, named without a schema, are the run's own.
DATABASE_URL = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
engine = create_engine(DATABASE_URL, pool_size=10, max_overflow=10, pool_pre_ping=True)

app = FastAPI()

MAX_KEY_LENGTH = 255


class CreateReport(BaseModel):
    # An unknown field is refused (422), not ignored: its sender believes it means something.
    model_config = ConfigDict(extra="forbid")
    # bigint's range: a larger number would be a database error (a 500), not a bad request.
    task_id: int = Field(gt=0, le=2**63 - 1)
    # Printable: PostgreSQL's text refuses a NUL byte, which would be a 500 as well.
    report_type: str = Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": code, "message": message})


def payload_hash(body: CreateReport) -> str:
    """sha256 of the fields that define the report: a retry must carry the same ones."""
    canonical = json.dumps({"task_id": body.task_id, "report_type": body.report_type})
    return hashlib.sha256(canonical.encode()).hexdigest()


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/reports")
def create_report(body: CreateReport, idempotency_key: str | None = Header(default=None)):
    # TODO(1): a key that is empty or blank, or longer than MAX_KEY_LENGTH, makes no report and
    # is refused with 400 and a JSON body (the contract above). As written, such a key is
    # ignored and the report is made. Attacked by: invalid-key.

    digest = payload_hash(body)
    # One transaction: committed when the block ends, before the answer is sent.
    with engine.begin() as conn:
        # TODO(2): one key makes at most one report, however its requests interleave and
        # whatever happens after the COMMIT (a lost answer, a timeout, a crash): the key's later
        # requests get that report back (200, "replayed": true), or 409 when their content
        # differs. As written, the key is ignored and every request makes a report.
        # Attacked by: replay, conflict, lost-answer, timeout, race, burst, crash.
        # (`lab exercise hint report-api` when you are stuck.)
        report_id = conn.execute(
            text("INSERT INTO reports (task_id, report_type, payload_hash) VALUES (:task, :type, :hash) RETURNING id"),
            {"task": body.task_id, "type": body.report_type, "hash": digest},
        ).scalar_one()
    return JSONResponse(status_code=201, content={"report_id": report_id, "replayed": False})


if __name__ == "__main__":
    # Loopback only, on the port the lab (or you) gives; no access log, so the lab's narrative
    # is not interleaved with it.
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), access_log=False)
