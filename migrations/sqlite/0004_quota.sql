-- Quota lots (purchased or granted top-ups) and hourly spend buckets, the record of truth for
-- balances. A rolling week is the last 168 hourly buckets.
CREATE TABLE quota_lots (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    amount BIGINT NOT NULL,
    remaining BIGINT NOT NULL,
    tier TEXT,
    source TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX quota_lots_user ON quota_lots (user_id, expires_at);
CREATE INDEX quota_lots_created ON quota_lots (created_at);

CREATE TABLE quota_spend (
    user_id TEXT NOT NULL,
    hour BIGINT NOT NULL,
    allowance_tokens BIGINT NOT NULL DEFAULT 0,
    allowance_requests BIGINT NOT NULL DEFAULT 0,
    lot_tokens BIGINT NOT NULL DEFAULT 0,
    lot_requests BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, hour)
);
