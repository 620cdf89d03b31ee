-- Website sign-in. Codes, link tokens and session ids are stored only as HMAC-SHA256 digests
-- keyed by the session secret, so a database dump cannot be replayed. Timestamps are Unix
-- milliseconds.

-- One sign-in attempt: the emailed code and magic link share it, so using either consumes both.
CREATE TABLE auth_challenges (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL,
    code_hash TEXT NOT NULL,
    link_hash TEXT NOT NULL UNIQUE,
    code_expires_at BIGINT NOT NULL,
    link_expires_at BIGINT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    consumed_at BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX auth_challenges_updated_at ON auth_challenges (updated_at);

CREATE TABLE auth_sessions (
    id_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id),
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL
);
CREATE INDEX auth_sessions_user ON auth_sessions (user_id);
CREATE INDEX auth_sessions_expires_at ON auth_sessions (expires_at);

-- Fixed-window hit counters (one row per bucket and window) for request-code limits; kept in
-- the database so every instance sees the same counts.
CREATE TABLE auth_rate_counters (
    bucket TEXT NOT NULL,
    window_start BIGINT NOT NULL,
    hits BIGINT NOT NULL,
    PRIMARY KEY (bucket, window_start)
);
CREATE INDEX auth_rate_counters_window ON auth_rate_counters (window_start);
