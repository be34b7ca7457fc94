-- The tables of the lessons, in one file: what the lab creates in every run's own schema, and
-- what you create in a database of your own for the exercises:
--
--     psql -d DATABASE -f schema.sql
--
-- No table here names a schema: they go where your search_path says (public, unless you set
-- it). The lab runs this file with search_path set to the run's schema (lab_<run>), so dropping
-- that schema at the end removes everything. Every statement can run again: IF NOT EXISTS.
--
-- PostgreSQL 13 or newer. Nothing else is needed: no extension, no role.

-- ─── Our side: the background tasks (lesson 6, §1) ──────────────────────────────────────────
--
-- A worker reserves a task with a lease (claim_task: pending, or processing with an expired
-- lease, becomes processing; attempts + 1), calls the report service, and records the result
-- (complete_task). attempts counts reservations and doubles as a fencing token: complete_task()
-- accepts only the attempt that holds the task now, so a worker whose lease was taken over
-- cannot overwrite the new holder's result.
CREATE TABLE IF NOT EXISTS tasks (
    id          bigint PRIMARY KEY,
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'processing', 'completed')),
    attempts    integer NOT NULL DEFAULT 0,
    lease_until timestamptz,
    report_id   bigint
);

-- ─── The other side: the report service's tables (lesson 6, §4) ─────────────────────────────
--
-- The UNIQUE constraint on idempotency_key is the whole deduplication: two requests with one key
-- cannot both insert, however they interleave (the second INSERT waits for the first to commit,
-- then inserts nothing). A NULL key (a request without Idempotency-Key) is never equal to
-- another NULL, so requests without a key always create a new report.
CREATE TABLE IF NOT EXISTS reports (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL,
    report_type     text NOT NULL,
    idempotency_key text UNIQUE,
    -- sha256 of the request's payload: a retry must carry the same payload as the first call
    -- (the same key with another payload is refused with 409).
    payload_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The broken design the lesson warns against, kept beside the right one for comparison: the
-- same columns and no UNIQUE guard. Its endpoint checks with a SELECT, then INSERTs, and two
-- requests that overlap both insert. Only the lab's `concurrent` scenario uses it.
CREATE TABLE IF NOT EXISTS naive_reports (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL,
    report_type     text NOT NULL,
    idempotency_key text,
    payload_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The report service's "report ready" notifications, one row per notification a mailer is to
-- send. Where the row is written is the lesson: written in the same transaction as the report
-- (an outbox), there is one per report however often the request is retried; written outside
-- it, before the key is checked, every retry adds one. Only the lab's `idempotent` scenario
-- switches the service to write them (`PUT /config {"notify": …}`); by default it writes none.
CREATE TABLE IF NOT EXISTS report_notifications (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    bigint NOT NULL,
    -- NULL when written before the service knew which report the request makes.
    report_id  bigint,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- ─── Lesson C: the invoice worker's own database ────────────────────────────────────────────
--
-- The invoice worker books every invoice it handles: one row per booking. Nothing here stops a
-- second row for the same invoice; that is the point of the `worker` scenario's last part. The
-- coordinator's record lives in Redis, the ledger here, and a worker that dies between its
-- COMMIT and the coordinator storing the result leaves a row the coordinator does not know of.
CREATE TABLE IF NOT EXISTS invoice_ledger (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id        uuid NOT NULL,
    invoice_version integer NOT NULL,
    booked_at       timestamptz NOT NULL DEFAULT now()
);

-- The processing record: written in the same transaction as the booking, under the job's own
-- identity (the coordinator's operation and key). The primary key lets one transaction per job
-- insert it; a job handled again finds it and books nothing. ledger_id is NULL only inside the
-- transaction that is booking.
CREATE TABLE IF NOT EXISTS processed_jobs (
    operation       text NOT NULL,
    idempotency_key text NOT NULL,
    ledger_id       bigint,
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation, idempotency_key)
);
