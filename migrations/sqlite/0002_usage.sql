-- One row per developer request (evt_<id>), written in batches off the request path.
CREATE TABLE usage_events (
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
);
CREATE INDEX usage_events_user_time ON usage_events (user_id, created_at);
