-- Hand-written: what the Prisma schema cannot say.

-- The sequencer (sequenced_positions) gave positions one UPDATE per event inside a loop, and its first test
-- (`position IS NULL AND (sweep OR id = ANY(wanted))`) was planned once for both callers, as a scan of the
-- whole table: its cost grew with the table and showed as a sixth of the database's CPU under a burst of
-- creates. Now the test is asked one way per caller, unpositioned events have an index of their own (empty
-- between calls), and one statement positions them all.
--
-- Positions stay in id order and gapless within a call. The statement counts the unpositioned events and
-- positions them from the same snapshot, so the block it reserves from the sequence (one nextval and one
-- setval, under the lock that every caller takes) is exactly as long as the events it numbers.
CREATE INDEX "instance_events_unpositioned_idx" ON "instance_events" ("id") WHERE "position" IS NULL;

--
-- Its statements are planned once per connection and kept. Planned while the table is small (a new
-- deployment, or statistics not yet refreshed after a burst), they would scan it whole for as long as the
-- connection lives; every one of them is a lookup by the primary key or the partial index, so the function
-- plans with sequential scans off.
CREATE OR REPLACE FUNCTION "sequence_instance_events"(wanted BIGINT[], sweep BOOLEAN DEFAULT false)
RETURNS TABLE ("id" BIGINT, "position" BIGINT)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
  -- Nothing to wait for when the wanted events were positioned already (by another writer's call).
  IF (CASE WHEN sweep THEN EXISTS (SELECT 1 FROM instance_events i WHERE i."position" IS NULL)
           ELSE EXISTS (SELECT 1 FROM instance_events i WHERE i.id = ANY(wanted) AND i."position" IS NULL) END) THEN
    PERFORM pg_advisory_xact_lock(72707370);
    -- A statement after the lock: its snapshot holds everything the previous holder committed.
    WITH todo AS (
           SELECT i.id, row_number() OVER (ORDER BY i.id) AS k, count(*) OVER () AS n
             FROM instance_events i WHERE i."position" IS NULL),
         block AS MATERIALIZED (
           SELECT setval('instance_events_position_seq', nextval('instance_events_position_seq') + t.n - 1) - t.n AS before
             FROM (SELECT n FROM todo LIMIT 1) t)
    UPDATE instance_events e SET "position" = block.before + todo.k
      FROM todo, block WHERE e.id = todo.id;
  END IF;
  RETURN QUERY SELECT i.id, i."position" FROM instance_events i WHERE i.id = ANY(wanted);
END $$;
