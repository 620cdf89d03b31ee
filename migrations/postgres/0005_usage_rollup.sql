-- Hourly usage per account and model, kept by `UsageStore::insert_batch` in the same
-- transaction as the events it counts, so the account usage report reads at most
-- 720 hours x models rows instead of every event of a busy account. `hour` is
-- created_at / 3600000 (Unix hours, UTC).
CREATE TABLE usage_rollup (
    user_id TEXT NOT NULL,
    hour BIGINT NOT NULL,
    model TEXT NOT NULL,
    requests BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    total_tokens BIGINT NOT NULL,
    PRIMARY KEY (user_id, hour, model)
);

-- Events recorded before this migration.
INSERT INTO usage_rollup (user_id, hour, model, requests, input_tokens, output_tokens, total_tokens)
SELECT user_id, created_at / 3600000, model, CAST(COUNT(*) AS BIGINT),
       CAST(SUM(input_tokens) AS BIGINT), CAST(SUM(output_tokens) AS BIGINT),
       CAST(SUM(total_tokens) AS BIGINT)
FROM usage_events
GROUP BY user_id, created_at / 3600000, model;
