-- The public draw records (waitroom.PGDraws, docs/DRAW.md): a sale's
-- record is built once, by the sale's leader gateway right after the
-- draw, and stored here with its gzip form and entity tag. Gateways serve
-- these bytes; no request rebuilds a record. A record never changes: the
-- first stored stays.
CREATE TABLE draw_records (
    sale_id    BIGINT      PRIMARY KEY,
    body       BYTEA       NOT NULL,
    gzip       BYTEA       NOT NULL,
    etag       TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
