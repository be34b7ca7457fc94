-- Our side of the reports lesson: background tasks, reserved with a lease.
--
-- The lab runs this with search_path set to the run's own schema (lab_<run>), so no table here
-- names a schema, and dropping that schema at the end removes everything.

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
