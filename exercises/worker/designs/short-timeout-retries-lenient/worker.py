"""Worker with a short HTTP timeout and same-key retries (correct, non-strict).

Claim (its own transaction, committed) -> POST /reports with the key report-task-<id>; httpx gives
up after 0.5 s and the call is retried, same key, up to 8 times with a 0.3 s pause (a timeout,
a dropped connection or a 5xx) -> complete_task fenced by attempts.
A retry after the report was made is answered with that report, so retrying is safe.
Non-strict: the completion is fenced by attempts alone, expired lease or not.
"""

import os
import sys
import time

import httpx
import psycopg

TASK_ID = int(os.environ["TASK_ID"])
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
REPORTS_URL = os.environ["REPORTS_URL"].rstrip("/")
WORKER = os.environ.get("WORKER", "worker")

TIMEOUT = 0.5
TRIES = 8
PAUSE = 0.3


def log(msg: str) -> None:
    print(f"{WORKER} {time.monotonic():.3f}: {msg}", flush=True)


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
    body = {"task_id": TASK_ID, "report_type": "monthly"}
    headers = {"Idempotency-Key": f"report-task-{TASK_ID}"}
    with httpx.Client(timeout=TIMEOUT) as client:
        for n in range(1, TRIES + 1):
            try:
                response = client.post(f"{REPORTS_URL}/reports", json=body, headers=headers)
                if response.status_code < 500:
                    response.raise_for_status()
                    log(f"try {n}: {response.status_code} {response.text}")
                    return response.json()["report_id"]
                log(f"try {n}: {response.status_code}")
            except httpx.TransportError as e:  # timeouts included
                log(f"try {n}: {type(e).__name__}")
            if n < TRIES:
                time.sleep(PAUSE)
    raise RuntimeError(f"no answer from the report service after {TRIES} tries")


def complete_task(conn: psycopg.Connection, attempt: int, report_id: int) -> bool:
    row = conn.execute(
        "UPDATE tasks SET status = 'completed', report_id = %s, lease_until = NULL"
        " WHERE id = %s AND status = 'processing' AND attempts = %s RETURNING id",
        (report_id, TASK_ID, attempt),
    ).fetchone()
    return row is not None


def main() -> int:
    # autocommit: every statement is its own transaction; nothing stays open across the call.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        attempt = claim_task(conn)
        if attempt is None:
            log(f"task {TASK_ID} is not mine to take")
            return 2
        log(f"claimed task {TASK_ID}, attempt {attempt}")
        report_id = create_report()
        if not complete_task(conn, attempt, report_id):
            log(f"completion of task {TASK_ID} (attempt {attempt}) refused")
            return 3
        log(f"task {TASK_ID} completed with report {report_id} (attempt {attempt})")
        return 0


if __name__ == "__main__":
    sys.exit(main())
