-- 003: per-instance push tokens, issued at registration; only their SHA-256 is stored.
CREATE TABLE instance_tokens (
    instance_id   VARCHAR NOT NULL,
    token_sha256  VARCHAR NOT NULL,
    issued_at     TIMESTAMP NOT NULL
);
