-- usage_events keyed by (user_id, created_at, id): one index per event instead of two.
-- Every read of raw events is per account and time, none by id alone, so the primary key takes
-- the place of the (user_id, created_at) index and the index on id goes. The id stays unique in
-- practice (creation time + 71 random bits) and a retried event repeats all three columns, so
-- `ON CONFLICT DO NOTHING` still skips it. Building the new key reads the table once, at the
-- first start after upgrading, before the gateway serves.
ALTER TABLE usage_events DROP CONSTRAINT usage_events_pkey;
ALTER TABLE usage_events ADD PRIMARY KEY (user_id, created_at, id);
DROP INDEX usage_events_user_time;
