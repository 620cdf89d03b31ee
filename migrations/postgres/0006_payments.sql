-- Payments by bank transfer (spec §2.5-§2.7, §4.4; CONTRACT §3). Money moves exactly once:
-- a webhook item is keyed by the bank's transaction id (the idempotency key), and marking an
-- order paid, granting its lot and recording the transaction happen in one transaction.

-- Orders. `kind` + `quantity` (+ `tier` for packages) is the lot a payment grants.
-- `payment_code` is the code the customer writes in the transfer description; top-ups through a
-- personal code are recorded as already-paid orders with no code of their own
-- (`personal_code` says which code carried them).
CREATE TABLE payment_orders (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    package_id TEXT,
    kind TEXT NOT NULL,
    quantity BIGINT NOT NULL,
    tier TEXT,
    amount_vnd BIGINT NOT NULL,
    payment_code TEXT UNIQUE,
    personal_code TEXT,
    status TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    paid_at BIGINT,
    transaction_id TEXT,
    lot_id TEXT
);
CREATE INDEX payment_orders_user ON payment_orders (user_id, created_at);
CREATE INDEX payment_orders_status ON payment_orders (status, expires_at);

-- Every webhook item ever received, verbatim (`raw`), with the result it got. The primary key
-- makes a resent or concurrently delivered transaction a no-op.
CREATE TABLE payment_transactions (
    transaction_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    kind TEXT NOT NULL,
    amount_vnd BIGINT NOT NULL,
    description TEXT NOT NULL,
    bank TEXT NOT NULL,
    transferred_at TEXT NOT NULL,
    payment_code TEXT,
    order_id TEXT,
    user_id TEXT,
    lot_id TEXT,
    raw TEXT NOT NULL,
    received_at BIGINT NOT NULL,
    resolved_at BIGINT
);
CREATE INDEX payment_transactions_status ON payment_transactions (status, received_at);

-- Manual reconciliation: who credited which transaction to which order, when and why.
CREATE TABLE payment_audit (
    id TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    transaction_id TEXT NOT NULL,
    order_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    previous_transaction_status TEXT NOT NULL,
    previous_order_status TEXT NOT NULL,
    lot_id TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX payment_audit_transaction ON payment_audit (transaction_id);
