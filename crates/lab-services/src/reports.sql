-- The report service's own tables.
--
-- The lab runs this with search_path set to the run's own schema (lab_<run>), so no table here
-- names a schema, and dropping that schema at the end removes everything.

-- The UNIQUE constraint on idempotency_key is the whole deduplication: two requests with one key
-- cannot both insert, however they interleave. A NULL key (a request without Idempotency-Key) is
-- never equal to another NULL, so requests without a key always create a new report.
CREATE TABLE reports (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL,
    report_type     text NOT NULL,
    idempotency_key text UNIQUE,
    -- sha256 of the request's payload: a retry must carry the same payload as the first call.
    payload_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- The naive design, kept apart for comparison: the same columns, no UNIQUE guard. The naive
-- endpoint checks with a SELECT, then INSERTs.
CREATE TABLE naive_reports (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id         bigint NOT NULL,
    report_type     text NOT NULL,
    idempotency_key text,
    payload_hash    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
