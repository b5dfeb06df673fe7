-- Hand-written: what the Prisma schema cannot say.

-- A write that is alone in its process (nothing else of the process is writing) positions its events in its
-- own transaction, in the message that commits it, instead of a sequencer transaction after it: an idle write's
-- path (a host's report, a pause) loses a round trip and a flush. Under a burst, writers keep the sequencer
-- (sequenced_positions), whose one transaction serves them all.
--
-- Same lock, same rule as sequence_instance_events: under the lock, everything unpositioned that this
-- transaction sees (its own events and every committed one) is positioned in id order, from a block reserved
-- in one step. The lock is held through this transaction's commit, which follows in the same message, so the
-- next holder's snapshot holds these positions. Returns what it positioned: the writer's own events among them.
CREATE FUNCTION "position_pending_instance_events"()
RETURNS TABLE ("id" BIGINT, "position" BIGINT)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM instance_events i WHERE i."position" IS NULL) THEN
    PERFORM pg_advisory_xact_lock(72707370);
    RETURN QUERY
      WITH todo AS (
             SELECT i.id, row_number() OVER (ORDER BY i.id) AS k, count(*) OVER () AS n
               FROM instance_events i WHERE i."position" IS NULL),
           block AS MATERIALIZED (
             SELECT setval('instance_events_position_seq', nextval('instance_events_position_seq') + t.n - 1) - t.n AS before
               FROM (SELECT n FROM todo LIMIT 1) t)
      UPDATE instance_events e SET "position" = block.before + todo.k
        FROM todo, block WHERE e.id = todo.id
      RETURNING e.id, e."position";
  END IF;
END $$;

-- The sequencer's own call now numbers through the same function, so the rule is written once.
CREATE OR REPLACE FUNCTION "sequence_instance_events"(wanted BIGINT[], sweep BOOLEAN DEFAULT false)
RETURNS TABLE ("id" BIGINT, "position" BIGINT)
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
  -- Nothing to wait for when the wanted events were positioned already (by another writer's call).
  IF (CASE WHEN sweep THEN EXISTS (SELECT 1 FROM instance_events i WHERE i."position" IS NULL)
           ELSE EXISTS (SELECT 1 FROM instance_events i WHERE i.id = ANY(wanted) AND i."position" IS NULL) END) THEN
    PERFORM count(*) FROM position_pending_instance_events();
  END IF;
  RETURN QUERY SELECT i.id, i."position" FROM instance_events i WHERE i.id = ANY(wanted);
END $$;
