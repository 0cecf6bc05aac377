CREATE TABLE sales (
    id                 BIGSERIAL PRIMARY KEY,
    name               TEXT        NOT NULL,
    starts_at          TIMESTAMPTZ NOT NULL,
    ends_at            TIMESTAMPTZ,
    admission_rate     INT         NOT NULL CHECK (admission_rate > 0),
    shuffle_seed       BYTEA       NOT NULL,
    shuffle_commitment TEXT        NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Item ids start at 1001 so they never look like sale ids in examples.
CREATE SEQUENCE items_id_seq START 1001;
CREATE TABLE items (
    id          BIGINT  PRIMARY KEY DEFAULT nextval('items_id_seq'),
    sale_id     BIGINT  NOT NULL REFERENCES sales (id),
    product_id  BIGINT  NOT NULL,
    quantity    INT     NOT NULL CHECK (quantity > 0),
    price_cents BIGINT  NOT NULL CHECK (price_cents >= 0),
    -- sold counts live orders (PENDING + PAID).
    sold        INT     NOT NULL DEFAULT 0,
    CONSTRAINT chk_not_oversold CHECK (sold >= 0 AND sold <= quantity)
);
ALTER SEQUENCE items_id_seq OWNED BY items.id;
CREATE INDEX items_sale ON items (sale_id);

CREATE TABLE orders (
    id          UUID        PRIMARY KEY,
    sale_id     BIGINT      NOT NULL REFERENCES sales (id),
    item_id     BIGINT      NOT NULL REFERENCES items (id),
    user_id     BIGINT      NOT NULL,
    status      TEXT        NOT NULL CHECK (status IN ('PENDING','PAID','EXPIRED','CANCELLED','REJECTED')),
    price_cents BIGINT      NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    paid_at     TIMESTAMPTZ,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    reject_reason TEXT
);
-- One live order per user per sale (invariant 2). Expired, cancelled and
-- rejected orders do not count, so the user may buy again after them.
CREATE UNIQUE INDEX orders_one_live_per_user ON orders (sale_id, user_id)
    WHERE status IN ('PENDING', 'PAID');
CREATE INDEX orders_pending_expiry ON orders (expires_at) WHERE status = 'PENDING';
CREATE INDEX orders_user ON orders (user_id, sale_id);

-- Outbox of units to give back to Redis. A row is written in the same
-- transaction that makes an order EXPIRED, CANCELLED or REJECTED; it is
-- deleted once the Redis release script ran (the script is idempotent per
-- order, so a retry never gives a unit back twice).
CREATE TABLE stock_returns (
    order_id   UUID        PRIMARY KEY,
    sale_id    BIGINT      NOT NULL,
    item_id    BIGINT      NOT NULL,
    user_id    BIGINT      NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Bot-defense settings: one row, the current JSON document.
CREATE TABLE settings (
    id         INT         PRIMARY KEY CHECK (id = 1),
    body       JSONB       NOT NULL,
    version    BIGINT      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by TEXT        NOT NULL
);

CREATE TABLE audit_log (
    id     BIGSERIAL   PRIMARY KEY,
    at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor  TEXT        NOT NULL,
    action TEXT        NOT NULL,
    body   JSONB       NOT NULL
);
