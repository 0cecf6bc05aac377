-- Outbox of shopper events (package events): a shopper's turn came
-- (shopper.admitted), told to the shop's webhook so that it can send its
-- own SMS or email. A sale's leader gateway writes the rows, off its tick,
-- only when a webhook is configured; the webhook deliverer POSTs them and
-- sets webhook_done_at once the shop's endpoint accepted the event or it
-- was dead-lettered. They are not published to Kafka.
--
-- id is the event's eventId, drawn from the order events' sequence so that
-- one id names one event whatever its kind: the shop deduplicates both
-- kinds by X-Flashsale-Event-Id. One row per (sale, place, kind): a write
-- repeated after a lost answer, or a turn reported twice, adds nothing.
-- The delivery state is in the row (an order event's is in
-- webhook_attempts and webhook_dead_letters, which reference
-- order_events).
CREATE TABLE shopper_events (
    id              BIGINT      PRIMARY KEY DEFAULT nextval('order_events_id_seq'),
    sale_id         BIGINT      NOT NULL,
    user_id         BIGINT      NOT NULL,
    place           BIGINT      NOT NULL CHECK (place >= 0),
    kind            TEXT        NOT NULL CHECK (kind IN ('admitted', 'held')),
    type            TEXT        NOT NULL,
    -- body is the event exactly as it is POSTed (schema version 1,
    -- docs/shopper-event.schema.json), eventId included.
    body            JSONB       NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    webhook_done_at TIMESTAMPTZ,
    attempts        INT         NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ,
    last_status     INT,
    last_error      TEXT        NOT NULL DEFAULT '',
    -- dead_at: FLASHSALE_WEBHOOK_MAX_ATTEMPTS failures; no longer retried.
    dead_at         TIMESTAMPTZ,
    UNIQUE (sale_id, place, kind)
);
-- The webhook's work list: small once caught up.
CREATE INDEX shopper_events_undelivered ON shopper_events (id) WHERE webhook_done_at IS NULL;

-- flashsale_shopper_event_body builds a shopper event's body, the one
-- definition of its JSON shape.
CREATE FUNCTION flashsale_shopper_event_body(
    event_id bigint, event_type text, occurred_at timestamptz,
    sale_id bigint, user_id bigint, place bigint, kind text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'version', 1,
        'eventId', event_id,
        'type', event_type,
        'occurredAt', to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'saleId', sale_id,
        'userId', user_id::text,
        'place', place,
        'kind', kind)
$$;
