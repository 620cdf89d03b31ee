-- Two-factor enrolment in two steps, and recovery codes.
--
-- `totp_pending_secret` holds the sealed seed of an enrolment that no code has confirmed yet;
-- two-factor stays off until one does, so a mis-scanned secret never locks anyone out.
ALTER TABLE users ADD COLUMN totp_pending_secret TEXT;

-- Single-use recovery codes, stored only as HMAC digests keyed by the session secret and bound
-- to their user. `used_at` is set once, by one conditional UPDATE.
CREATE TABLE two_factor_recovery_codes (
    user_id TEXT NOT NULL REFERENCES users (id),
    code_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    used_at BIGINT,
    PRIMARY KEY (user_id, code_hash)
);
