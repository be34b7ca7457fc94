"""Worker that calls the report service without an Idempotency-Key (broken).

Claim (committed before the call), completion fenced by attempts and the running lease: as the
lesson says. The FLAW is in create_report(): no Idempotency-Key header, so the service cannot
tell the call of the attempt that takes the task over from a new request, and makes a second
report for the same task.
"""

import os
import sys

import httpx
import psycopg

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"].rstrip("/")
STRICT = os.environ.get("STRICT", "true") == "true"
WORKER = os.environ.get("WORKER", "worker")


def claim_task(conn: psycopg.Connection) -> int | None:
    row = conn.execute(
        """UPDATE tasks SET status = 'processing', attempts = attempts + 1,
                  lease_until = now() + make_interval(secs => %s)
            WHERE id = %s
              AND (status = 'pending' OR (status = 'processing' AND lease_until < now()))
        RETURNING attempts""",
        (LEASE_SECONDS, TASK_ID),
    ).fetchone()
    return row[0] if row else None


def create_report() -> int:
    response = httpx.post(  # FLAW: no Idempotency-Key
        f"{REPORTS_URL}/reports",
        json={"task_id": TASK_ID, "report_type": "monthly"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["report_id"]


def complete_task(conn: psycopg.Connection, attempt: int, report_id: int) -> bool:
    lease = " AND lease_until > now()" if STRICT else ""
    return (
        conn.execute(
            "UPDATE tasks SET status = 'completed', report_id = %s, lease_until = NULL"
            " WHERE id = %s AND status = 'processing' AND attempts = %s" + lease + " RETURNING id",
            (report_id, TASK_ID, attempt),
        ).fetchone()
        is not None
    )


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
