-- CreateTable
CREATE TABLE "host_commands" (
    "id" TEXT NOT NULL,
    "node_id" TEXT NOT NULL,
    "instance_id" TEXT,
    "kind" TEXT NOT NULL,
    "args" JSONB NOT NULL,
    "state" TEXT NOT NULL DEFAULT 'pending',
    "deadline" TIMESTAMPTZ(3) NOT NULL,
    "result" JSONB,
    "error" TEXT,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "started_at" TIMESTAMPTZ(3),
    "finished_at" TIMESTAMPTZ(3),
    "settled_at" TIMESTAMPTZ(3),

    CONSTRAINT "host_commands_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "instance_snapshots" (
    "id" TEXT NOT NULL,
    "instance_id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "node_id" TEXT NOT NULL,
    "state" TEXT NOT NULL DEFAULT 'creating',
    "size_bytes" BIGINT,
    "error" TEXT,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "ready_at" TIMESTAMPTZ(3),

    CONSTRAINT "instance_snapshots_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "host_commands_node_id_state_idx" ON "host_commands"("node_id", "state");

-- CreateIndex
CREATE INDEX "host_commands_instance_id_settled_at_idx" ON "host_commands"("instance_id", "settled_at");

-- CreateIndex
CREATE INDEX "host_commands_settled_at_deadline_idx" ON "host_commands"("settled_at", "deadline");

-- CreateIndex
CREATE INDEX "instance_snapshots_instance_id_idx" ON "instance_snapshots"("instance_id");

-- AddForeignKey
ALTER TABLE "host_commands" ADD CONSTRAINT "host_commands_node_id_fkey" FOREIGN KEY ("node_id") REFERENCES "nodes"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "instance_snapshots" ADD CONSTRAINT "instance_snapshots_instance_id_fkey" FOREIGN KEY ("instance_id") REFERENCES "instances"("id") ON DELETE CASCADE ON UPDATE CASCADE;
