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

import os
import sys

import httpx
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
                "       lease_until = clock_timestamp() + make_interval(secs => :lease) "
                " WHERE id = :id "
                # TODO(1): a task whose worker died is taken over once its lease has run out,
                # and never while it runs. As written, only a pending task can be claimed, so a
                # task left processing by a dead worker stays stuck.
                # Attacked by: crash-after-commit, stale-completion.
                "   AND status = 'pending' "
                "RETURNING attempts"
            ),
            {"id": task_id, "lease": lease_seconds},
        ).scalar()


def create_report(task_id: int) -> int:
    """POST /reports: the task's one call to the report service."""
    # TODO(2): every attempt at this task, by whichever worker, must end with the same one
    # report: a retry after a crash finds the report the first attempt made. As written, the
    # service cannot tell a retry from a new report. Attacked by: crash-after-commit.
    response = httpx.post(
        f"{REPORTS_URL}/reports",
        json={"task_id": task_id, "report_type": "monthly"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["report_id"]


def complete_task(task_id: int, attempt: int, report_id: int, strict: bool) -> bool:
    """Records the result, only for the attempt that holds the task (and, strict, in time)."""
    # TODO(3): only the attempt that holds the task now may complete it: a worker whose task
    # was taken over must not overwrite the new holder's result, and, strict, nobody completes
    # once the lease has run out. As written, any worker completes the task at any time.
    # Attacked by: stale-completion, expired-lease. (`lab exercise hint worker` when stuck.)
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
