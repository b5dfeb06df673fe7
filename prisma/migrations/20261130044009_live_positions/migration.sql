-- DropIndex
DROP INDEX "instance_events_pool_id_id_idx";

-- DropIndex
DROP INDEX "instance_events_tenant_id_id_idx";

-- AlterTable
ALTER TABLE "instance_events" ADD COLUMN     "position" BIGINT;

-- CreateIndex
CREATE UNIQUE INDEX "instance_events_position_key" ON "instance_events"("position");

-- CreateIndex
CREATE INDEX "instance_events_tenant_id_position_idx" ON "instance_events"("tenant_id", "position");

-- CreateIndex
CREATE INDEX "instance_events_pool_id_position_idx" ON "instance_events"("pool_id", "position");

-- Hand-written below: what the Prisma schema cannot say.

-- Positions are handed out in commit order. Event rows are inserted mid-transaction, so their ids follow
-- insertion, not commit: a reader could see id 11 before id 10 commits and, resuming after 11, miss 10.
-- The writing transaction instead takes positions as its last act, under one transaction-scoped lock held
-- through COMMIT: the next writer gets its positions only after this one is visible. The lock is the last
-- one any writer takes and it only touches its own new rows while holding it, so it cannot deadlock.
CREATE SEQUENCE "instance_events_position_seq" AS BIGINT;

UPDATE "instance_events" e SET "position" = o.n
  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM "instance_events") o
 WHERE e.id = o.id;
SELECT setval('instance_events_position_seq', COALESCE((SELECT max("position") FROM "instance_events"), 0) + 1, false);

CREATE FUNCTION sequence_instance_events(event_ids BIGINT[]) RETURNS TABLE (id BIGINT, "position" BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
  e BIGINT;
BEGIN
  PERFORM pg_advisory_xact_lock(72707370);
  -- In id order, so one transaction's events for an instance keep their version order.
  FOR e IN SELECT unnest(event_ids) ORDER BY 1 LOOP
    UPDATE instance_events SET "position" = nextval('instance_events_position_seq') WHERE instance_events.id = e
      RETURNING instance_events.id, instance_events."position" INTO id, "position";
    RETURN NEXT;
  END LOOP;
END $$;
