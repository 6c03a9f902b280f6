-- One row per stored response. params, input and response are JSON
-- (the Response as asked, its input items, the Response as it ended);
-- a deleted response keeps its row as a tombstone (status 'deleted', no
-- content), so that a workflow finishing after the delete does not
-- bring it back.
CREATE TABLE IF NOT EXISTS responses (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    user_name    TEXT NOT NULL DEFAULT '',
    status       TEXT NOT NULL,
    params       TEXT NOT NULL DEFAULT '',
    input        TEXT NOT NULL DEFAULT '',
    response     TEXT NOT NULL DEFAULT '',
    previous_id  TEXT NOT NULL DEFAULT '',
    created_at   BIGINT NOT NULL,
    completed_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS responses_tenant_created ON responses (tenant, created_at);
