-- Users and API keys. Timestamps are Unix milliseconds; flags are 0/1 integers so the same
-- queries run on SQLite and Postgres.
CREATE TABLE users (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_login_at BIGINT,
    two_factor_enabled BIGINT NOT NULL DEFAULT 0,
    totp_secret TEXT,
    manual_tier TEXT NOT NULL,
    unlimited BIGINT NOT NULL DEFAULT 0,
    suspended BIGINT NOT NULL DEFAULT 0,
    max_tier TEXT,
    payment_code TEXT UNIQUE
);
CREATE INDEX users_updated_at ON users (updated_at);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    key_prefix TEXT NOT NULL,
    key_suffix TEXT NOT NULL,
    scopes TEXT NOT NULL,
    limit_mode TEXT NOT NULL,
    custom_input_tpm BIGINT,
    custom_output_tpm BIGINT,
    custom_rpm BIGINT,
    model_allowlist TEXT NOT NULL,
    max_input_tokens BIGINT,
    max_output_tokens BIGINT,
    status TEXT NOT NULL,
    is_global BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_used_at BIGINT,
    revoked_at BIGINT
);
CREATE INDEX api_keys_user ON api_keys (user_id, status);
CREATE INDEX api_keys_updated_at ON api_keys (updated_at);
