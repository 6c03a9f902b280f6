-- One row per file. Its content is in file_chunks: whole lines, about a
-- MiB a chunk, numbered from 0, each with the number of its first line
-- (from 1), so that a reader may start at any line without reading what
-- comes before. A deleted file keeps its row as a tombstone (status
-- 'deleted', its chunks gone).
CREATE TABLE IF NOT EXISTS files (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    filename   TEXT NOT NULL DEFAULT '',
    bytes      BIGINT NOT NULL,
    lines      BIGINT NOT NULL,
    endpoint   TEXT NOT NULL DEFAULT '',
    status     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS files_tenant_created ON files (tenant, created_at);
CREATE TABLE IF NOT EXISTS file_chunks (
    file_id    TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    first_line BIGINT NOT NULL,
    data       TEXT NOT NULL,
    PRIMARY KEY (file_id, seq)
);
