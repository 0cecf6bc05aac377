-- How a sale's units are allocated (flashsale.Sale.Allocation): 'race'
-- (admitted shoppers race for them; every sale made before this setting)
-- or 'queue' (a unit held for each shopper at their turn for
-- claim_window_seconds).
ALTER TABLE sales
    ADD COLUMN allocation           TEXT NOT NULL DEFAULT 'race' CHECK (allocation IN ('race', 'queue')),
    ADD COLUMN claim_window_seconds INT  NOT NULL DEFAULT 120 CHECK (claim_window_seconds BETWEEN 10 AND 3600);
