-- One usage event per request id, as an invariant of the table rather than of the code paths
-- that record events (the settlement, the usage journal's replay of a process that died, a
-- retried batch, the drain at shutdown). The key (user_id, created_at, id) let one id in twice
-- when its two records differed in time (an admission replayed as interrupted beside the
-- settled event); a unique index on the id alone does not, and the writer's
-- `ON CONFLICT DO NOTHING` skips the second record, its rollup count and its quota breakdown.
-- Any duplicates already stored are dropped first, keeping each id's earliest record. The
-- index costs each event one more B-tree insert.
CREATE INDEX usage_events_id_dups ON usage_events (id);
DELETE FROM usage_events WHERE EXISTS (
    SELECT 1 FROM usage_events AS o
    WHERE o.id = usage_events.id
      AND (o.created_at < usage_events.created_at
           OR (o.created_at = usage_events.created_at AND o.user_id < usage_events.user_id))
);
DROP INDEX usage_events_id_dups;
CREATE UNIQUE INDEX usage_events_id ON usage_events (id);
