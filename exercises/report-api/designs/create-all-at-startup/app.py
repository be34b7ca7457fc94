"""Report service, ORM design with create_all at start-up (correct).

The reports table of schema.sql is declared as an ORM model, and Base.metadata.create_all() runs
at start-up, as an ORM service does to make sure its tables exist. A keyed request inserts with
ON CONFLICT (idempotency_key) DO NOTHING RETURNING id; no row back: the stored report is read and
its payload hash compared (200 replay, or 409).
"""

import hashlib
import os
from contextlib import asynccontextmanager
from datetime import datetime

import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, Identity, String, Text, create_engine, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

engine = create_engine(os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1))


class Base(DeclarativeBase):
    pass


class Report(Base):
    __tablename__ = "reports"
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    task_id: Mapped[int] = mapped_column(BigInteger)
    report_type: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(Text, unique=True)
    payload_hash: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


@asynccontextmanager
async def lifespan(app: FastAPI):
    Base.metadata.create_all(engine)
    yield


app = FastAPI(lifespan=lifespan)


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
    digest = hashlib.sha256(f"{body.task_id}/{body.report_type}".encode()).hexdigest()
    with Session(engine) as session, session.begin():
        report_id = session.scalar(
            insert(Report)
            .values(task_id=body.task_id, report_type=body.report_type,
                    idempotency_key=idempotency_key, payload_hash=digest)
            .on_conflict_do_nothing(index_elements=[Report.idempotency_key])
            .returning(Report.id)
        )
        if report_id is not None:
            return JSONResponse({"report_id": report_id, "replayed": False}, status_code=201)
        stored = session.scalars(select(Report).where(Report.idempotency_key == idempotency_key)).one()
        if stored.payload_hash != digest:
            return JSONResponse({"error": "Idempotency-Key reused with another request"}, status_code=409)
        return JSONResponse({"report_id": stored.id, "replayed": True}, status_code=200)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
