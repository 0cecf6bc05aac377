-- payments: every payment the shop's provider reported for an order
-- (POST /api/shop/orders/{orderId}/paid), keyed by the provider's payment
-- id, with what flashsale answered: PAID, or the refusal's code
-- (ORDER_EXPIRED, ORDER_CANCELLED, ORDER_PAID). A repeat of the payment id
-- answers the recorded outcome and changes nothing.
CREATE TABLE payments (
    payment_id   TEXT        PRIMARY KEY,
    order_id     UUID        NOT NULL,
    outcome      TEXT        NOT NULL CHECK (outcome IN ('PAID','ORDER_EXPIRED','ORDER_CANCELLED','ORDER_PAID')),
    amount_cents BIGINT      NOT NULL,
    currency     TEXT        NOT NULL DEFAULT '',
    created_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX payments_order ON payments (order_id);

-- payment_signatures: the signatures (t and v1 of the header) of accepted
-- callbacks, so that every gateway refuses a replay of one (409 REPLAYED).
-- A row is useless once its signed_at is out of the replay window, and is
-- deleted some time after.
CREATE TABLE payment_signatures (
    signature TEXT        PRIMARY KEY,
    signed_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX payment_signatures_signed_at ON payment_signatures (signed_at);
