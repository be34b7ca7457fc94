"""Worker whose claim is a read, a decision in Python, then a write (broken; strict).

The key report-task-<id>, completion fenced by attempts and the lease, the claim committed
before the call: as the lesson says. The FLAW is in claim_task(): the SELECT takes no lock and
the UPDATE is by id alone, so two workers that read the task between each other's SELECT and
UPDATE both find it free and both claim it (attempts + 2, both call the service).
"""

import json
import os
import sys
import urllib.request

import psycopg

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"].rstrip("/")
STRICT = os.environ.get("STRICT", "true") == "true"
WORKER = os.environ.get("WORKER", "worker")


def claim_task(conn: psycopg.Connection) -> int | None:
    status, expired = conn.execute(
        "SELECT status, coalesce(lease_until < now(), true) FROM tasks WHERE id = %s", (TASK_ID,)
    ).fetchone()
    if not (status == "pending" or (status == "processing" and expired)):
        return None
    # FLAW: another worker may have claimed it since the SELECT; nothing here would notice.
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
    lease = " AND lease_until > now()" if STRICT else ""
    with conn.transaction():
        done = conn.execute(
            "UPDATE tasks SET status = 'completed', report_id = %s, lease_until = NULL"
            " WHERE id = %s AND status = 'processing' AND attempts = %s" + lease + " RETURNING id",
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
