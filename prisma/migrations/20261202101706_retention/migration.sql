-- CreateTable
CREATE TABLE "retention_horizons" (
    "name" TEXT NOT NULL,
    "position" BIGINT NOT NULL DEFAULT 0,
    "pruned_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "retention_horizons_pkey" PRIMARY KEY ("name")
);

-- CreateIndex
CREATE INDEX "host_commands_settled_at_idx" ON "host_commands"("settled_at");
