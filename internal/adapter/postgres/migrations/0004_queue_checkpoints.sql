-- The waiting room's durable part (waitroom.PGDurable): what of a sale's
-- queue must outlive a Redis loss. The sale's leader gateway checkpoints
-- it every second; a gateway that finds the queue gone from Redis, or
-- behind, restores it from here and from its own connections.
--
-- queue_state: per sale, the tickets saved (seq), the pre-queue size frozen
-- at the draw (n, -1 before it) and the admission cursor (serving), which
-- is never lowered.
CREATE TABLE queue_state (
    sale_id  BIGINT      PRIMARY KEY,
    seq      BIGINT      NOT NULL DEFAULT 0 CHECK (seq >= 0),
    n        BIGINT      NOT NULL DEFAULT -1 CHECK (n >= -1),
    serving  BIGINT      NOT NULL DEFAULT 0 CHECK (serving >= 0),
    saved_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- queue_tickets: the tickets in join order, one row per checkpoint:
-- users[i] (1-based arrays: users[i + 1]) holds ticket first_ticket + i;
-- 0 marks a ticket whose holder a restore could not learn.
CREATE TABLE queue_tickets (
    sale_id      BIGINT   NOT NULL,
    first_ticket BIGINT   NOT NULL CHECK (first_ticket >= 0),
    users        BIGINT[] NOT NULL,
    PRIMARY KEY (sale_id, first_ticket)
);
