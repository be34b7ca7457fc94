\set k random(0, 99)
BEGIN;
INSERT INTO reports (task_id, report_type, idempotency_key, payload_hash) VALUES (:k + 1, 'storm', 'pgbench-' || :k, 'pgbench') ON CONFLICT (idempotency_key) DO NOTHING RETURNING id;
SELECT id, payload_hash FROM reports WHERE idempotency_key = 'pgbench-' || :k;
COMMIT;
