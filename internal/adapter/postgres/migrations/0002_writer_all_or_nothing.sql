-- The writer's usual batch (every order new, every item within its
-- quantity) is one statement committed on its own: the insert and the
-- guarded `sold` update as data-modifying CTEs, and this check of their row
-- counts. When a row was there already or an item would go over its
-- quantity, the check raises and the whole statement is rolled back; the
-- writer then takes its general path, which finds and reports the cause.
CREATE FUNCTION flashsale_all_or_nothing(ok boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION 'flashsale: the batch is not all new orders within their items'' quantities';
    END IF;
    RETURN true;
END
$$;
