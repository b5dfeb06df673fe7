-- Hand-written: what the Prisma schema cannot say.

-- A quota charge as a statement of its own, called from inside the statement that needs it (admission's).
-- Every create of a tenant waits on that tenant's usage rows. When a statement's UPDATE waits for a row that its
-- holder then changes, PostgreSQL rechecks the row (EvalPlanQual) and first sets up every subplan of the
-- statement again: for admission's one statement, a dozen CTEs for each wait. Inside a function the UPDATE
-- is its own small plan, and that is all a recheck sets up. Same guard as before: a row is raised only within
-- its limit, and fewer rows returned than asked means a limit was hit.
--
-- The UPDATE finds the tenant's rows by the primary key. Planned once per connection and kept, it would otherwise
-- scan the whole table for as long as the connection lives if planned while the table looked small, and these
-- are the rows every create of the tenant rewrites: their old versions pile up between vacuums.
CREATE FUNCTION "charge_quota"(tenant TEXT, resources TEXT[], amounts BIGINT[], go BOOLEAN DEFAULT true)
RETURNS SETOF TEXT
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
  IF go THEN
    RETURN QUERY
      UPDATE quota_usage u SET used = u.used + w.amount
        FROM unnest(resources, amounts) AS w(resource, amount)
       WHERE u.tenant_id = tenant AND u.resource = w.resource
         AND u.used + w.amount <= COALESCE((SELECT l."limit" FROM quota_limits l WHERE l.tenant_id = tenant AND l.resource = w.resource), u.used + w.amount)
      RETURNING u.resource;
  END IF;
END $$;
