-- The operator's controls of a running sale and what shoppers see of its
-- items.
--
-- version: 1 at creation, +1 on every change of the sale, so that a write
-- naming the version its operator saw (If-Match) applies only to it.
-- paused: the kill switch (no admission, no purchase).
-- message_text, message_at: the operator's note to everyone in the queue
-- ('' and NULL: none).
ALTER TABLE sales
    ADD COLUMN version      BIGINT      NOT NULL DEFAULT 1 CHECK (version >= 1),
    ADD COLUMN paused       BOOLEAN     NOT NULL DEFAULT false,
    ADD COLUMN message_text TEXT        NOT NULL DEFAULT '',
    ADD COLUMN message_at   TIMESTAMPTZ;

-- name, image_url, currency: flashsale.Item's rules (Validate); items of
-- older sales get the names the pages used to show.
ALTER TABLE items
    ADD COLUMN name      TEXT NOT NULL DEFAULT '',
    ADD COLUMN image_url TEXT NOT NULL DEFAULT '',
    ADD COLUMN currency  TEXT NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$');
UPDATE items SET name = 'Product ' || product_id WHERE name = '';

-- stock_adds is the outbox of live stock additions: written in the
-- transaction that raises items.quantity, deleted once every stock shard
-- in Redis has the units. Each shard's step is guarded by a marker of the
-- row's id, so a retry after a crash between the shards adds nothing twice.
CREATE TABLE stock_adds (
    id         BIGSERIAL   PRIMARY KEY,
    sale_id    BIGINT      NOT NULL REFERENCES sales (id),
    item_id    BIGINT      NOT NULL REFERENCES items (id),
    units      BIGINT      NOT NULL CHECK (units > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
