-- One row per finished request, keyed by its request id: a retried
-- record conflicts and changes nothing. Times are unix milliseconds and
-- day is the UTC day as YYYY-MM-DD, so that grouping and ranges are the
-- same plain SQL on SQLite and PostgreSQL. "user" is reserved in
-- PostgreSQL, hence user_name.
CREATE TABLE usage_records (
    request_id        TEXT PRIMARY KEY,
    tenant            TEXT NOT NULL,
    user_name         TEXT NOT NULL,
    key_id            TEXT NOT NULL,
    model             TEXT NOT NULL,
    pool              TEXT NOT NULL,
    route             TEXT NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    outcome           TEXT NOT NULL,
    reason            TEXT NOT NULL,
    finished_at       BIGINT NOT NULL,
    day               TEXT NOT NULL
);

-- A tenant's own queries and the admins' across tenants both range over
-- days.
CREATE INDEX usage_records_tenant_day ON usage_records (tenant, day);
CREATE INDEX usage_records_day ON usage_records (day);
