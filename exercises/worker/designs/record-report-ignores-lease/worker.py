"""Worker that records the report id before completing, without the lease check (broken; strict).

Claim (committed before the call), key report-task-<id>, completion fenced by attempts and the
running lease: as the lesson says. The FLAW is in record_report(): once the service answers, the
report id is written to the task fenced by attempts alone, so with strict = true an attempt
whose lease has run out still writes its result (report_id) though its completion is refused.
"""

import os
import sys

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"].rstrip("/")
STRICT = os.environ.get("STRICT", "true") == "true"
WORKER = os.environ.get("WORKER", "worker")

engine = create_engine(
    os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1),
    poolclass=NullPool,
)

MINE = "id = :id AND status = 'processing' AND attempts = :attempt"


def claim_task() -> int | None:
    with engine.begin() as conn:
        return conn.execute(
            text(
                "UPDATE tasks SET status = 'processing', attempts = attempts + 1,"
                "       lease_until = now() + make_interval(secs => :lease)"
                " WHERE id = :id"
                "   AND (status = 'pending' OR (status = 'processing' AND lease_until < now()))"
                " RETURNING attempts"
            ),
            {"id": TASK_ID, "lease": LEASE_SECONDS},
        ).scalar()


def create_report() -> int:
    response = httpx.post(
        f"{REPORTS_URL}/reports",
        json={"task_id": TASK_ID, "report_type": "monthly"},
        headers={"Idempotency-Key": f"report-task-{TASK_ID}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["report_id"]


def record_report(attempt: int, report_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(  # FLAW: strict, yet no lease_until > now() here
            text(f"UPDATE tasks SET report_id = :report WHERE {MINE}"),
            {"id": TASK_ID, "attempt": attempt, "report": report_id},
        )


def complete_task(attempt: int) -> bool:
    lease = " AND lease_until > now()" if STRICT else ""
    with engine.begin() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE tasks SET status = 'completed', lease_until = NULL"
                    f" WHERE {MINE} AND report_id IS NOT NULL{lease} RETURNING id"
                ),
                {"id": TASK_ID, "attempt": attempt},
            ).first()
            is not None
        )


def main() -> int:
    attempt = claim_task()
    if attempt is None:
        print(f"{WORKER}: task {TASK_ID} is not mine to take")
        return 2
    report_id = create_report()
    record_report(attempt, report_id)
    if not complete_task(attempt):
        print(f"{WORKER}: completion of task {TASK_ID} (attempt {attempt}) refused")
        return 3
    print(f"{WORKER}: task {TASK_ID} completed with report {report_id} (attempt {attempt})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
