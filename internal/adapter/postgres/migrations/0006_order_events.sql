-- Outbox of order events (package events). A row is written in the same
-- transaction as the order change it tells of, so an event exists exactly
-- when its change committed. The relay publishes the rows to Kafka in id
-- order and sets published_at; the webhook deliverer sets webhook_done_at
-- once the shop's endpoint accepted the event or it was dead-lettered.
-- id is the event's eventId: unique, and increasing per order because one
-- order's changes are serialised by its row lock.
CREATE TABLE order_events (
    id              BIGSERIAL   PRIMARY KEY,
    order_id        UUID        NOT NULL,
    type            TEXT        NOT NULL,
    -- body is the event exactly as it is published (schema version 1,
    -- docs/order-event.schema.json), eventId included.
    body            JSONB       NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    published_at    TIMESTAMPTZ,
    webhook_done_at TIMESTAMPTZ
);
-- The relay's work list and the webhook's: both stay small once caught
-- up, whatever the size of the table.
CREATE INDEX order_events_unpublished ON order_events (id) WHERE published_at IS NULL;
CREATE INDEX order_events_undelivered ON order_events (order_id, id) WHERE webhook_done_at IS NULL;
CREATE INDEX order_events_order ON order_events (order_id, id);

-- flashsale_order_event_body builds an event's body, the one definition
-- of its JSON shape for every writer (the writer's batch statement builds
-- it in SQL; events.Append calls it too). paymentId and reason are left
-- out when NULL.
CREATE FUNCTION flashsale_order_event_body(
    event_id bigint, event_type text, occurred_at timestamptz, order_id uuid,
    sale_id bigint, item_id bigint, user_id bigint, status text,
    price_cents bigint, payment_id text, reason text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'version', 1,
        'eventId', event_id,
        'type', event_type,
        'occurredAt', to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'orderId', order_id::text,
        'saleId', sale_id,
        'itemId', item_id,
        'userId', user_id::text,
        'status', status,
        'priceCents', price_cents)
    || jsonb_strip_nulls(jsonb_build_object('paymentId', payment_id, 'reason', reason))
$$;

-- The relay's exactly-once state: per partition of the events topic, the
-- offset up to which every record's event is known marked published. It is
-- written in the transaction that sets published_at; after a crash the
-- relay reads each partition from here to its end and marks what it finds
-- before producing anything, so an event acknowledged by Kafka but not yet
-- marked is never produced again.
CREATE TABLE order_event_relay_offsets (
    topic_partition INT         PRIMARY KEY,
    next_offset     BIGINT      NOT NULL CHECK (next_offset >= 0),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Webhook delivery state of an event that failed at least once: how many
-- attempts, when the next one is due and what the last one got.
CREATE TABLE webhook_attempts (
    event_id        BIGINT      PRIMARY KEY REFERENCES order_events (id),
    attempts        INT         NOT NULL,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    last_status     INT,
    last_error      TEXT        NOT NULL DEFAULT ''
);

-- Events the shop's endpoint refused FLASHSALE_WEBHOOK_MAX_ATTEMPTS times.
-- They are no longer retried; the order's later events proceed. The event
-- itself stays in order_events (and on the Kafka topic).
CREATE TABLE webhook_dead_letters (
    event_id    BIGINT      PRIMARY KEY REFERENCES order_events (id),
    attempts    INT         NOT NULL,
    last_status INT,
    last_error  TEXT        NOT NULL DEFAULT '',
    dead_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
