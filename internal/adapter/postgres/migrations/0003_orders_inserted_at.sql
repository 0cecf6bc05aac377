-- When each order row was written: the writer's statement fills it from
-- PostgreSQL's clock (clock_timestamp(), not the transaction's start), and
-- no later change of the order touches it. With created_at (the
-- reservation, the gateway's clock) it gives every order's way from Redis
-- to the database, which the load harness reports per run; updated_at
-- cannot, a payment moves it. Rows older than this migration get the time
-- it ran.
ALTER TABLE orders ADD COLUMN inserted_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp();
