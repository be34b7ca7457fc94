"""Worker that claims with SELECT ... FOR UPDATE SKIP LOCKED, non-strict completion (correct).

claim_task: one transaction, committed before the call: lock the task if it is free (pending,
or processing with an expired lease), skipping it if another worker is claiming it right now,
then UPDATE it to processing with attempts + 1 and a new lease. The call: POST /reports with the
key report-task-<id>. complete_task: only the attempt that holds the task (attempts = mine), at
any time: a late result is accepted as long as no later attempt has claimed the task.
"""

import json
import os
import sys
import urllib.request

import psycopg

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"].rstrip("/")
WORKER = os.environ.get("WORKER", "worker")


def claim_task(conn: psycopg.Connection) -> int | None:
    with conn.transaction():
        free = conn.execute(
            """SELECT id FROM tasks
                WHERE id = %s
                  AND (status = 'pending' OR (status = 'processing' AND lease_until < now()))
                  FOR UPDATE SKIP LOCKED""",
            (TASK_ID,),
        ).fetchone()
        if free is None:
            return None
        (attempt,) = conn.execute(
            """UPDATE tasks SET status = 'processing', attempts = attempts + 1,
                      lease_until = now() + make_interval(secs => %s)
                WHERE id = %s RETURNING attempts""",
            (LEASE_SECONDS, TASK_ID),
        ).fetchone()
        return attempt


def create_report() -> int:
    request = urllib.request.Request(
        f"{REPORTS_URL}/reports",
        data=json.dumps({"task_id": TASK_ID, "report_type": "monthly"}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": f"report-task-{TASK_ID}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["report_id"]


def complete_task(conn: psycopg.Connection, attempt: int, report_id: int) -> bool:
    with conn.transaction():
        done = conn.execute(
            "UPDATE tasks SET status = 'completed', report_id = %s, lease_until = NULL"
            " WHERE id = %s AND status = 'processing' AND attempts = %s RETURNING id",
            (report_id, TASK_ID, attempt),
        ).fetchone()
        return done is not None


def main() -> int:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        attempt = claim_task(conn)
        if attempt is None:
            print(f"{WORKER}: task {TASK_ID} is not mine to take")
            return 2
        report_id = create_report()
        if not complete_task(conn, attempt, report_id):
            print(f"{WORKER}: completion of task {TASK_ID} (attempt {attempt}) refused")
            return 3
        print(f"{WORKER}: task {TASK_ID} completed with report {report_id} (attempt {attempt})")
        return 0


if __name__ == "__main__":
    sys.exit(main())
