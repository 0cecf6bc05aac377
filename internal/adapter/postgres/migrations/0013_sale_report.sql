-- The waiting room's part of the report after the drop (GET
-- /api/admin/sales/{id}/report), minute by minute. Each gateway counts in
-- memory what its own room sees of a sale in the current minute and writes
-- it here every few seconds and when it stops (waitroom.PGReport): one row
-- per (sale, minute, gateway), overwritten with the gateway's figures so
-- far for that minute. A write repeated after a lost answer changes
-- nothing, and the fleet's figure is read across the gateways' rows: the
-- largest for the queue's readings, the sum for the counts. The orders'
-- part of the report is read from the orders themselves (the order store).
CREATE TABLE sale_report_minutes (
    sale_id     BIGINT      NOT NULL,
    minute      TIMESTAMPTZ NOT NULL, -- the minute's start
    gateway     TEXT        NOT NULL, -- the writing process's id (Room's lease owner id)
    -- The queue as the gateway read it from Redis during the minute (the
    -- largest reading): tickets handed out, places the cursor passed, the
    -- pre-queue size frozen at the draw (-1: not drawn yet).
    seq         BIGINT      NOT NULL DEFAULT 0 CHECK (seq >= 0),
    serving     BIGINT      NOT NULL DEFAULT 0 CHECK (serving >= 0),
    prequeue    BIGINT      NOT NULL DEFAULT -1 CHECK (prequeue >= -1),
    -- Counted by the gateway during the minute. holds: places of a sale in
    -- queue order admitted with a held unit (the leader's allocation).
    -- refusals: rule → joins refused. waits: per bucket of
    -- waitroom's wait bounds, the shoppers admitted on this gateway whose
    -- wait from join to admission fell in it; wait_min_ms and wait_max_ms
    -- the shortest and longest (NULL: none).
    holds       BIGINT      NOT NULL DEFAULT 0 CHECK (holds >= 0),
    refusals    JSONB       NOT NULL DEFAULT '{}',
    waits       BIGINT[]    NOT NULL DEFAULT '{}',
    wait_min_ms BIGINT,
    wait_max_ms BIGINT,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (sale_id, minute, gateway)
);
