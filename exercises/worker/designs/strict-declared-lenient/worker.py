"""Worker that declares non-strict completion but completes strictly (broken).

Claim (committed before the call), the key report-task-<id>, completion fenced by attempts: as
the lesson says. The FLAW is in complete_task(): lab-exercise.toml says strict = false, yet the
completion always requires a running lease (STRICT is ignored), so a late worker is refused
though no other attempt took the task over, and the task stays processing.
"""

import json
import os
import sys
import urllib.request

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"].rstrip("/")
WORKER = os.environ.get("WORKER", "worker")

engine = create_engine(
    os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1),
    poolclass=NullPool,
)


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
    request = urllib.request.Request(
        f"{REPORTS_URL}/reports",
        data=json.dumps({"task_id": TASK_ID, "report_type": "monthly"}).encode(),
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": f"report-task-{TASK_ID}",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["report_id"]


def complete_task(attempt: int, report_id: int) -> bool:
    with engine.begin() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE tasks SET status = 'completed', report_id = :report, lease_until = NULL"
                    " WHERE id = :id AND status = 'processing' AND attempts = :attempt"
                    "   AND lease_until > now()"  # FLAW: non-strict was declared
                    " RETURNING id"
                ),
                {"id": TASK_ID, "attempt": attempt, "report": report_id},
            ).first()
            is not None
        )


def main() -> int:
    attempt = claim_task()
    if attempt is None:
        print(f"{WORKER}: task {TASK_ID} is not mine to take")
        return 2
    report_id = create_report()
    if not complete_task(attempt, report_id):
        print(f"{WORKER}: completion of task {TASK_ID} (attempt {attempt}) refused")
        return 3
    print(f"{WORKER}: task {TASK_ID} completed with report {report_id} (attempt {attempt})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
