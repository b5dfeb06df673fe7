-- Hand-written: what the Prisma schema cannot say.

-- Admission's last statement commits in the same round trip as it runs (Sql.commitWith), so a refusal it finds
-- (no address, no node, a quota limit) must fail the statement rather than return a row: this raises, with what
-- the statement saw as the detail, and the caller explains the refusal from it.
CREATE FUNCTION "admission_refused"(detail JSONB) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'BC001', MESSAGE = 'admission refused', DETAIL = detail::text;
END $$;
