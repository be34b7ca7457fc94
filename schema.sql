-- The tables of one lab run.
--
-- `lab` runs this file with search_path set to the run's own schema (lab_<run>), so no table
-- here names a schema, and dropping that schema at the end removes everything. To look at a
-- kept run: `lab run NAME --keep` prints the psql line.

-- Our side (Lesson A): background tasks, reserved with a lease.
-- attempts counts reservations and doubles as a fencing token: complete_task() only accepts the
-- attempt that holds the task now.
CREATE TABLE tasks (
    id          bigint PRIMARY KEY,
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'processing', 'completed')),
    attempts    integer NOT NULL DEFAULT 0,
    lease_until timestamptz,
    report_id   bigint
);

-- The external report service's own table. The UNIQUE constraint on idempotency_key is the whole
-- deduplication: two requests with one key cannot both insert, however they interleave.
-- A NULL key (a request without Idempotency-Key) is never equal to another NULL, so requests
-- without a key always create a new report.
CREATE TABLE reports (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL,
    report_type     text NOT NULL,
    idempotency_key text UNIQUE,
    -- sha256 of the request's payload: a retry must carry the same payload as the first call.
    payload_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The naive design, kept apart for comparison: the same columns, no UNIQUE guard. The report
-- service's naive endpoint checks with a SELECT, then INSERTs.
CREATE TABLE naive_reports (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL,
    report_type     text NOT NULL,
    idempotency_key text,
    payload_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
