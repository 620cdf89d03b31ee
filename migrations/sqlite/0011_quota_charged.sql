-- The quota tokens each request was charged at its model's weights, beside its raw token
-- counts, and the rollup's cached input tokens (which the operator's cost report prices apart).
-- NULL for rows recorded before this migration, when every token cost one quota token:
-- readers take `total_tokens` as their charge and count none of their input as cached, so no
-- existing row is rewritten.
ALTER TABLE usage_events ADD COLUMN quota_charged BIGINT;
ALTER TABLE usage_rollup ADD COLUMN quota_charged BIGINT;
ALTER TABLE usage_rollup ADD COLUMN cached_tokens BIGINT;
