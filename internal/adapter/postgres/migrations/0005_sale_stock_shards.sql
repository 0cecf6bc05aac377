-- stock_shards: how many Redis shards each item's stock of the sale is
-- split over (flashsale.Sale.StockShards), fixed at the sale's creation;
-- 1 keeps every key of the sale under one hash tag.
ALTER TABLE sales ADD COLUMN stock_shards INT NOT NULL DEFAULT 1
    CHECK (stock_shards BETWEEN 1 AND 16);
