-- Access rules per sale (docs/CONTRACT.md, "Access rules"). The rule itself
-- ({"rule", "publicFrom", "tiers"}) is a column of the sale, changed on the
-- sale's update path with its version and audit row; the sales package
-- owns it. The codes, their bindings and the allowlist are the access
-- package's (access.Store), the one place that names these tables.
ALTER TABLE sales ADD COLUMN access JSONB NOT NULL DEFAULT '{}';

-- An invitation code of a sale: single-use (max_uses 1, generated) or
-- multi-use (set by the operator with a use limit). used counts the users
-- it is bound to; it never passes max_uses.
CREATE TABLE access_codes (
    sale_id    BIGINT      NOT NULL REFERENCES sales (id),
    code       TEXT        NOT NULL,
    tier       SMALLINT    NOT NULL CHECK (tier BETWEEN 1 AND 9),
    max_uses   INT         NOT NULL CHECK (max_uses >= 1),
    used       INT         NOT NULL DEFAULT 0 CHECK (used >= 0 AND used <= max_uses),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (sale_id, code)
);

-- A redeemed code: the user holds it for the sale, and joins again (a
-- reconnect) without it. One binding per user and sale.
CREATE TABLE access_bindings (
    sale_id  BIGINT      NOT NULL,
    user_id  BIGINT      NOT NULL,
    code     TEXT        NOT NULL,
    tier     SMALLINT    NOT NULL,
    bound_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (sale_id, user_id),
    FOREIGN KEY (sale_id, code) REFERENCES access_codes (sale_id, code)
);

-- The users an allowlist sale lets in, with their tier. An upload
-- replaces the sale's list.
CREATE TABLE access_allowlist (
    sale_id BIGINT   NOT NULL REFERENCES sales (id),
    user_id BIGINT   NOT NULL CHECK (user_id > 0),
    tier    SMALLINT NOT NULL CHECK (tier BETWEEN 1 AND 9),
    PRIMARY KEY (sale_id, user_id)
);
