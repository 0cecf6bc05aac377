-- A Redis-loss rebuild counts a sale's stock from PostgreSQL and the
-- orders topic up to the end offsets it read; a record a lost Redis
-- reserved that lands past them was not counted, and must never take a
-- unit. items.stock_fences lists, per item, the fences the rebuilds wrote:
-- {"before": timestamptz, "offsets": {"partition": end offset}}. The
-- writer refuses a record created before a fence's "before" at or past
-- its offset (orderstore: the guard of the statement that counts the
-- item's units), and the fence is on the item's row so that the guard,
-- which waits for the row's lock, reads the fence committed meanwhile.
ALTER TABLE items ADD COLUMN stock_fences JSONB NOT NULL DEFAULT '[]'
    CHECK (jsonb_typeof(stock_fences) = 'array');
