"""A background worker of lesson 6 (§1, §9, §10): processes one task, once, whatever crashes.

As it is, it works as long as nothing goes wrong: a worker that dies after the report service
made the report leaves the task stuck, a retry would make a second report, and a stale worker
can overwrite the result of the one that took its task over. The three TODOs are the lesson.
What it must do:

    claim_task     pending (or processing with an expired lease) -> processing; attempts + 1
    the call       POST /reports with the stable key report-task-<id>: a retry of the same task,
                   by whichever worker, finds the report instead of making another
    complete_task  accepted only from the attempt that holds the task now (attempts is the
                   fencing token), and, strict, only while its lease runs

Each step is a transaction of its own: the claim commits before the HTTP call, so no
transaction stays open while the network decides how long the call takes.

The lab runs it once per attempt:  TASK_ID=42 LEASE_SECONDS=30 REPORTS_URL=http://... \\
    DATABASE_URL=postgresql://... STRICT=true .venv/bin/python worker.py
Exit codes: 0 completed, 2 nothing to claim, 3 completion refused.
"""

import json
import os
import sys
import urllib.request

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"]
STRICT = os.environ.get("STRICT", "true") == "true"
WORKER = os.environ.get("WORKER", "worker")

# The lab gives a plain postgresql:// URL; SQLAlchemy needs the driver in the scheme. One
# process, one task: no pool to keep.
engine = create_engine(
    os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1), poolclass=NullPool
)


def claim_task(task_id: int, lease_seconds: int) -> int | None:
    """Reserves the task; the attempt number it now holds, or None if someone else holds it."""
    with engine.begin() as conn:
        return conn.execute(
            text(
                "UPDATE tasks SET status = 'processing', attempts = attempts + 1, "
                "       lease_until = now() + make_interval(secs => :lease) "
                " WHERE id = :id "
                # TODO(1): a task whose holder died must be taken over: also reserve a task
                # that is 'processing' with an expired lease (lease_until < now()).
                "   AND status = 'pending' "
                "RETURNING attempts"
            ),
            {"id": task_id, "lease": lease_seconds},
        ).scalar()


def create_report(task_id: int) -> int:
    """POST /reports with the stable key: one key per task, the same on every attempt."""
    request = urllib.request.Request(
        f"{REPORTS_URL}/reports",
        data=json.dumps({"task_id": task_id, "report_type": "monthly"}).encode(),
        # TODO(3): a stable Idempotency-Key, the same for every attempt at this task (not one
        # made from the attempt number), so a retry finds the report instead of making another.
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["report_id"]


def complete_task(task_id: int, attempt: int, report_id: int, strict: bool) -> bool:
    """Records the result, only for the attempt that holds the task (and, strict, in time)."""
    # TODO(2): accept only the attempt that holds the task now (attempts = :attempt, the fencing
    # token) and still 'processing'; strict: only while the lease runs (lease_until > now()).
    with engine.begin() as conn:
        done = conn.execute(
            text(
                "UPDATE tasks SET status = 'completed', report_id = :report, lease_until = NULL "
                " WHERE id = :id RETURNING id"
            ),
            {"id": task_id, "attempt": attempt, "report": report_id},
        ).first()
        return done is not None


def main() -> int:
    attempt = claim_task(TASK_ID, LEASE_SECONDS)
    if attempt is None:
        print(f"{WORKER}: task {TASK_ID} is not mine to take")
        return 2
    report_id = create_report(TASK_ID)
    if not complete_task(TASK_ID, attempt, report_id, STRICT):
        print(f"{WORKER}: completion of task {TASK_ID} (attempt {attempt}) refused")
        return 3
    print(f"{WORKER}: task {TASK_ID} completed with report {report_id} (attempt {attempt})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
