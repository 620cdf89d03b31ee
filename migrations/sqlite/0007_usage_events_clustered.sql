-- usage_events keyed by its id alone (WITHOUT ROWID). With a rowid, every event was written
-- into three B-trees: the table (by rowid), the id's unique index and the (user_id,
-- created_at) index. Clustered by id, it is two: ids are time-ordered (`evt_` + creation time
-- + random), so the table itself grows at its right edge as the rowid table did, and the
-- unique index is gone. Rows are ~150 bytes, well inside SQLite's advice for WITHOUT ROWID
-- tables (under a twentieth of a page). Postgres keeps its heap table: it has no rowid tree.
-- The rebuild runs once, at the first start after upgrading: 4.0 s for 708,746 events on a
-- 2-core host (~6 s per million), before the gateway serves (new connections wait in the
-- listen queue meanwhile).
CREATE TABLE usage_events_clustered (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    reasoning_effort TEXT,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    total_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    status BIGINT NOT NULL,
    latency_ms BIGINT NOT NULL,
    ttfb_ms BIGINT,
    settlement TEXT NOT NULL,
    deployment TEXT,
    error_code TEXT,
    created_at BIGINT NOT NULL
) WITHOUT ROWID;

INSERT INTO usage_events_clustered (id, user_id, key_id, model, endpoint, reasoning_effort,
    input_tokens, output_tokens, total_tokens, cached_tokens, status, latency_ms, ttfb_ms,
    settlement, deployment, error_code, created_at)
SELECT id, user_id, key_id, model, endpoint, reasoning_effort, input_tokens, output_tokens,
    total_tokens, cached_tokens, status, latency_ms, ttfb_ms, settlement, deployment,
    error_code, created_at
FROM usage_events;

DROP TABLE usage_events;
ALTER TABLE usage_events_clustered RENAME TO usage_events;
CREATE INDEX usage_events_user_time ON usage_events (user_id, created_at);
