-- Hand-written: what the Prisma schema cannot say.

-- Positions are no longer taken inside the writing transaction. The old way (live_positions) took one lock as
-- the writer's last statement and held it through COMMIT, so every writer's commit, its WAL flush and the round
-- trip to its client and back queued behind the one before: commits could never share a flush.
--
-- Now writers commit their events without positions, and a sequencer gives positions to committed events,
-- after the fact, under one lock held through the sequencer's own commit. A reader that sees position p has
-- still seen every event below p (they were all given by sequencer transactions that committed first), and one
-- sequencer commit positions every event that committed before it, however many writers made them: under load
-- the flushes are shared. Each writer calls it right after its commit for its own events (the runner does, and
-- reads their positions for the bus messages), and the sweep calls it for events whose writer died in between.
--
-- Events are positioned in id order. One transaction's events for an instance are inserted in version order;
-- a later transaction's events for the same instance are inserted only after the earlier one committed (the
-- instance's row lock), so they have larger ids and are never positioned before it.
DROP FUNCTION "sequence_instance_events"(BIGINT[]);

CREATE FUNCTION "sequence_instance_events"(wanted BIGINT[], sweep BOOLEAN DEFAULT false)
RETURNS TABLE ("id" BIGINT, "position" BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
  e BIGINT;
BEGIN
  -- Nothing to wait for when the wanted events were positioned already (by another writer's call).
  IF EXISTS (SELECT 1 FROM instance_events i WHERE i."position" IS NULL AND (sweep OR i.id = ANY(wanted))) THEN
    PERFORM pg_advisory_xact_lock(72707370);
    -- A statement after the lock: its snapshot holds everything the previous holder committed.
    FOR e IN SELECT i.id FROM instance_events i WHERE i."position" IS NULL ORDER BY i.id LOOP
      UPDATE instance_events SET "position" = nextval('instance_events_position_seq') WHERE instance_events.id = e;
    END LOOP;
  END IF;
  RETURN QUERY SELECT i.id, i."position" FROM instance_events i WHERE i.id = ANY(wanted);
END $$;
