"""Report service, check then ON CONFLICT (BROKEN: a race with other content replays).

It SELECTs the key's report first and compares fingerprints (a replay, or 409), and only then
inserts ON CONFLICT DO NOTHING RETURNING id. The flaw is on the insert's no-row path: having
compared once already, it replays the stored report without comparing again. One after the
other, the SELECT catches other content (409); two requests with one key and different
contents that both SELECT before either commits both reach the insert, and the one that
inserts nothing is answered 200 with the other's report. psycopg, one connection per request.
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


class ReportRequest(BaseModel):
    task_id: int = Field(ge=1, le=2**63 - 1)
    report_type: str = Field(min_length=1, max_length=64, pattern=r"^[\x20-\x7e]+$")


def fingerprint(req: ReportRequest) -> str:
    return hashlib.sha256(f"{req.task_id}\n{req.report_type}".encode()).hexdigest()


@app.get("/health")
def health():
    return {"ok": True}


@app.post("/reports")
def create_report(req: ReportRequest, idempotency_key: str | None = Header(None)):
    if idempotency_key is not None and not (0 < len(idempotency_key.strip()) <= 255):
        return JSONResponse({"error": "invalid Idempotency-Key"}, status_code=400)
    fp = fingerprint(req)
    with psycopg.connect(DATABASE_URL) as conn:  # commits when the block ends
        if idempotency_key is not None:
            stored = conn.execute(
                "SELECT id, payload_hash FROM reports WHERE idempotency_key = %s", (idempotency_key,)
            ).fetchone()
            if stored is not None:
                if stored[1] != fp:
                    return JSONResponse({"error": "Idempotency-Key reused with other content"}, status_code=409)
                return JSONResponse({"report_id": stored[0], "replayed": True}, status_code=200)
        row = conn.execute(
            "INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            (req.task_id, req.report_type, idempotency_key, fp),
        ).fetchone()
        if row is not None:
            return JSONResponse({"report_id": row[0], "replayed": False}, status_code=201)
        # FLAW: compared before the insert, not after it: another request's report is replayed.
        (report_id,) = conn.execute(
            "SELECT id FROM reports WHERE idempotency_key = %s", (idempotency_key,)
        ).fetchone()
    return JSONResponse({"report_id": report_id, "replayed": True}, status_code=200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
