-- A draw by tier (the sale's access sets drawByTier; docs/DRAW.md "Tiers
-- in the draw") needs the tier each pre-queue ticket's holder joined
-- with, and whether the draw was frozen by tier, to outlive a Redis loss
-- as the tickets do (waitroom.PGDurable).
--
-- queue_state.tiered: set with n when the pre-queue closed by tier.
-- queue_tickets.tiers: a digit per ticket of the row ('1' to '9', '0' no
-- tier), as long as users; NULL when the row has no tiered ticket.
ALTER TABLE queue_state ADD COLUMN tiered BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE queue_tickets ADD COLUMN tiers TEXT
    CHECK (tiers IS NULL OR tiers ~ '^[0-9]*$');
