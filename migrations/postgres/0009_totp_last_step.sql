-- The time step of the last two-factor code accepted for the user: a code is accepted only
-- for a later step, so one code cannot be used twice (RFC 6238 §5.2).
ALTER TABLE users ADD COLUMN totp_last_step BIGINT;
