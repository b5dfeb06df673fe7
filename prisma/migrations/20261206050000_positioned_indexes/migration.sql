-- Hand-written: what the Prisma schema cannot say.

-- An event is written unpositioned and given its position once committed (sequenced_positions), so it has two
-- row versions, and each version has an entry in every index. The three indexes that lead with or end on the
-- position held an entry for the first version too, under NULL, which no reader ever looks up: every read of
-- events asks for positions after a cursor, and the sequencer finds the unpositioned through an index of their
-- own (sequencer_one_update). Made partial, they index positioned rows only: three index entries fewer for
-- every event written, and no dead NULL entries for vacuum to clear.
--
-- Same names, so the data model (prisma/schema.prisma) still describes them; the uniqueness of positions is
-- unchanged (NULLs never collided). Built in the migration's transaction: the table holds the retention window.
DROP INDEX "instance_events_position_key";
CREATE UNIQUE INDEX "instance_events_position_key" ON "instance_events" ("position") WHERE "position" IS NOT NULL;
DROP INDEX "instance_events_tenant_id_position_idx";
CREATE INDEX "instance_events_tenant_id_position_idx" ON "instance_events" ("tenant_id", "position") WHERE "position" IS NOT NULL;
DROP INDEX "instance_events_pool_id_position_idx";
CREATE INDEX "instance_events_pool_id_position_idx" ON "instance_events" ("pool_id", "position") WHERE "position" IS NOT NULL;
