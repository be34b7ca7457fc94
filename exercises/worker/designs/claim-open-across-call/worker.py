"""Worker that keeps its claim's transaction open across the HTTP call (broken).

The claim, the completion and everything else are as the lesson says (attempts + 1, key
report-task-<id>, completion fenced by attempts and, strict, the lease), but the FLAW is in
main(): one psycopg transaction (autocommit off) runs from the claim's UPDATE to the final
commit(), so while POST /reports is in flight the claim is uncommitted (the session sits idle in
transaction, holding the task's row lock) and a crash rolls the claim back.
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


def claim_task(cur: psycopg.Cursor) -> int | None:
    cur.execute(
        """UPDATE tasks SET status = 'processing', attempts = attempts + 1,
                  lease_until = now() + make_interval(secs => %s)
            WHERE id = %s
              AND (status = 'pending' OR (status = 'processing' AND lease_until < now()))
        RETURNING attempts""",
        (LEASE_SECONDS, TASK_ID),
    )
    row = cur.fetchone()
    return row[0] if row else None


def create_report() -> int:
    response = httpx.post(
        f"{REPORTS_URL}/reports",
        json={"task_id": TASK_ID, "report_type": "monthly"},
        headers={"Idempotency-Key": f"report-task-{TASK_ID}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["report_id"]


def complete_task(cur: psycopg.Cursor, attempt: int, report_id: int) -> bool:
    lease = " AND lease_until > now()" if STRICT else ""
    cur.execute(
        "UPDATE tasks SET status = 'completed', report_id = %s, lease_until = NULL"
        " WHERE id = %s AND status = 'processing' AND attempts = %s" + lease + " RETURNING id",
        (report_id, TASK_ID, attempt),
    )
    return cur.fetchone() is not None


def main() -> int:
    conn = psycopg.connect(os.environ["DATABASE_URL"])  # autocommit off: BEGIN on first statement
    cur = conn.cursor()
    attempt = claim_task(cur)
    if attempt is None:
        print(f"{WORKER}: task {TASK_ID} is not mine to take")
        return 2
    report_id = create_report()  # FLAW: the claim's transaction is still open here
    if not complete_task(cur, attempt, report_id):
        conn.rollback()
        print(f"{WORKER}: completion of task {TASK_ID} (attempt {attempt}) refused")
        return 3
    conn.commit()  # claim and completion commit together, after the call
    print(f"{WORKER}: task {TASK_ID} completed with report {report_id} (attempt {attempt})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
