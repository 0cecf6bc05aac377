-- The shadow queue's part of the report: each gateway counts, per sale and
-- minute, the shoppers it sent to a sale's shadow queue, by rule (the bot
-- defense's shadowQueue settings; waitroom/shadow.go), as refusals are
-- counted. Summed over the gateways' rows when read.
ALTER TABLE sale_report_minutes ADD COLUMN shadowed JSONB NOT NULL DEFAULT '{}';
