-- Which account each Responses id belongs to. A response or output item id an OpenAI-style
-- provider issued (`item` NULL) may only be referenced by the account it answered; an output
-- item the gateway issued in a translated answer also keeps the item itself (`item`, its JSON)
-- so that a later `item_reference` to it can be resolved. One row per (id, account): a provider
-- that hands the same id to two accounts gives each its own row. Rows older than
-- `storage.responses_retention_days` are deleted.
CREATE TABLE response_items (
    id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    item TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (id, user_id)
);
CREATE INDEX response_items_by_age ON response_items (created_at);
