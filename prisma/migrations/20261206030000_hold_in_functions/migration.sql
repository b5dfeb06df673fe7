-- Hand-written: what the Prisma schema cannot say.

-- A hosted create's address lease and node claim as functions, called from inside admission's statement (as
-- charge_quota is, and for the same reason). Both lock rows other creates want: the lowest free address and a
-- node's counters. When a lock in a statement meets a row changed since the statement's snapshot, PostgreSQL
-- rechecks it (EvalPlanQual) and first sets up every subplan of the statement again; with 16 creates on three
-- hosts most of them wait for a node, and a profile of admission's statement put a fifth of PostgreSQL's CPU in
-- those set-ups. Inside a function each lock is its own small plan, and each statement there takes a fresh
-- snapshot, so the claim after a wait no longer meets a stale row version at all.
--
-- Planned once per connection and kept: enable_seqscan off, as charge_quota, so a plan made while a table
-- looked small does not scan it for the rest of the connection's life.

-- The lowest free address of the pool's range, for `instance`; null when none is free or `go` is false. Rows
-- other creates are taking are skipped, never waited for. The range id is a scalar subquery so the partial index
-- on free rows serves the ORDER BY (a join sorted every free row of a /16).
CREATE FUNCTION "lease_address"(pool TEXT, instance TEXT, leased TIMESTAMPTZ, go BOOLEAN DEFAULT true)
RETURNS TEXT
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
  got TEXT;
BEGIN
  IF go THEN
    UPDATE ip_addresses SET instance_id = instance, leased_at = leased
     WHERE ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = pool) AND "offset" = (
       SELECT f."offset" FROM ip_addresses f WHERE f.ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = pool) AND f.instance_id IS NULL
        ORDER BY f."offset" LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING address INTO got;
  END IF;
  RETURN got;
END $$;

-- Whether a node takes a shape now: ready, neither lost nor gone, with room for it, and in a single-tenant pool
-- holding no other tenant. The one statement of the rule: claim_node's pick and claim, and the listing of a GPU
-- request's candidates (placement.ts) call it. SQL and this simple, PostgreSQL inlines it where it is called, so
-- a lock's recheck of a row evaluates it again on the row as it is once free.
CREATE FUNCTION "node_fits"(n nodes, vcpus INT, memory_mib BIGINT, disk_gib BIGINT, single_tenant BOOLEAN, tenant TEXT)
RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
  SELECT n.state = 'ready' AND n.lost_at IS NULL AND n.gone_at IS NULL
     AND n.cap_vcpus - n.alloc_vcpus >= vcpus AND n.cap_memory_mib - n.alloc_memory_mib >= memory_mib
     AND n.cap_disk_gib - n.alloc_disk_gib >= disk_gib
     AND (NOT single_tenant OR n.dedicated_tenant_id IS NULL OR n.dedicated_tenant_id = tenant)
$$;

-- Claim a node's counters for a shape (and bump its spec generation when `bump`): the best fit that no other
-- transaction holds (nodes without free GPUs first, so GPU hosts stay free for GPU work, then the fullest); when
-- every fitting node is held and `may_wait`, one of them at random, waited for, so waiters spread over the nodes
-- instead of queueing on one. The lock re-checks the fit on the row once it is free and moves on if it no
-- longer fits; the claim checks it again on the row it locked. `only_node` limits the choice to one node,
-- `avoid` excludes some. Returns one row when `go`: `picked` (the node locked, or null when none fits) and, when
-- the claim held, `id` and the node's spec generation after it.
CREATE FUNCTION "claim_node"(pool TEXT, vcpus INT, memory_mib BIGINT, disk_gib BIGINT, single_tenant BOOLEAN, tenant TEXT,
                             only_node TEXT, avoid TEXT[], bump BOOLEAN, may_wait BOOLEAN, go BOOLEAN DEFAULT true)
RETURNS TABLE ("picked" TEXT, "id" TEXT, "spec_generation" INT)
LANGUAGE plpgsql ROWS 1 SET enable_seqscan = off AS $$
DECLARE
  chosen TEXT;
  got TEXT;
  gen INT;
BEGIN
  IF NOT go THEN
    RETURN;
  END IF;
  SELECT n.id INTO chosen FROM nodes n
   WHERE n.pool_id = pool AND (only_node IS NULL OR n.id = only_node) AND NOT (n.id = ANY(avoid))
     AND node_fits(n, vcpus, memory_mib, disk_gib, single_tenant, tenant)
   ORDER BY (SELECT count(*) FROM node_gpus g WHERE g.node_id = n.id AND g.allocation_id IS NULL), n.cap_memory_mib - n.alloc_memory_mib, n.id
   LIMIT 1 FOR UPDATE SKIP LOCKED;
  IF chosen IS NULL AND may_wait THEN
    SELECT n.id INTO chosen FROM nodes n
     WHERE n.pool_id = pool AND (only_node IS NULL OR n.id = only_node) AND NOT (n.id = ANY(avoid))
       AND node_fits(n, vcpus, memory_mib, disk_gib, single_tenant, tenant)
     ORDER BY random() LIMIT 1 FOR UPDATE;
  END IF;
  IF chosen IS NOT NULL THEN
    UPDATE nodes n SET alloc_vcpus = n.alloc_vcpus + vcpus, alloc_memory_mib = n.alloc_memory_mib + memory_mib,
           alloc_disk_gib = n.alloc_disk_gib + disk_gib, alloc_instances = n.alloc_instances + 1,
           dedicated_tenant_id = CASE WHEN single_tenant THEN tenant ELSE n.dedicated_tenant_id END,
           spec_generation = n.spec_generation + CASE WHEN bump THEN 1 ELSE 0 END
     WHERE n.id = chosen AND node_fits(n, vcpus, memory_mib, disk_gib, single_tenant, tenant)
    RETURNING n.id, n.spec_generation INTO got, gen;
  END IF;
  RETURN QUERY SELECT chosen, got, gen;
END $$;

-- What the planner should expect of the set-returning functions in admission's statement: without it, each is
-- guessed at 1,000 rows, and the statement's joins on them were costed as if it wrote millions (enough for JIT
-- to compile it on every create, where the platform's sessions allow JIT).
ALTER FUNCTION "charge_quota"(TEXT, TEXT[], BIGINT[], BOOLEAN) ROWS 4;
