"""Worker whose fencing token is its own lease, not the attempt number (correct, non-strict).

claim_task (committed before the call) takes the task and returns the lease_until it wrote: a
value no other claim writes again (now() differs from one transaction to the next, to the
microsecond). complete_task is accepted while lease_until is still exactly that token (no
later claim rewrote it), run out or not. Key: report-task-<id>, the same on every attempt.
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


def claim_task():
    """The lease this worker now holds (its fencing token), or None."""
    with engine.begin() as conn:
        return conn.execute(
            text(
                "UPDATE tasks SET status = 'processing', attempts = attempts + 1,"
                "       lease_until = now() + make_interval(secs => :lease)"
                " WHERE id = :id"
                "   AND (status = 'pending' OR (status = 'processing' AND lease_until < now()))"
                " RETURNING lease_until"
            ),
            {"id": TASK_ID, "lease": LEASE_SECONDS},
        ).scalar()


def create_report() -> int:
    request = urllib.request.Request(
        f"{REPORTS_URL}/reports",
        data=json.dumps({"task_id": TASK_ID, "report_type": "monthly"}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": f"report-task-{TASK_ID}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["report_id"]


def complete_task(token, report_id: int) -> bool:
    with engine.begin() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE tasks SET status = 'completed', report_id = :report, lease_until = NULL"
                    " WHERE id = :id AND status = 'processing'"
                    "   AND lease_until = :token"
                    " RETURNING id"
                ),
                {"id": TASK_ID, "token": token, "report": report_id},
            ).first()
            is not None
        )


def main() -> int:
    token = claim_task()
    if token is None:
        print(f"{WORKER}: task {TASK_ID} is not mine to take")
        return 2
    report_id = create_report()
    if not complete_task(token, report_id):
        print(f"{WORKER}: completion of task {TASK_ID} (lease {token.isoformat()}) refused")
        return 3
    print(f"{WORKER}: task {TASK_ID} completed with report {report_id} (lease {token.isoformat()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
