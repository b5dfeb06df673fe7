-- AlterTable
ALTER TABLE "instances" ADD COLUMN     "attempts" INTEGER NOT NULL DEFAULT 0,
ADD COLUMN     "excluded_nodes" TEXT[] DEFAULT ARRAY[]::TEXT[],
ADD COLUMN     "observed_at" TIMESTAMPTZ(3),
ADD COLUMN     "observed_error" TEXT,
ADD COLUMN     "observed_generation" INTEGER NOT NULL DEFAULT -1,
ADD COLUMN     "observed_retryable" BOOLEAN NOT NULL DEFAULT false,
ADD COLUMN     "observed_shape" JSONB,
ADD COLUMN     "observed_state" TEXT,
ADD COLUMN     "retry_requested" BOOLEAN NOT NULL DEFAULT false,
ADD COLUMN     "spec_generation" INTEGER NOT NULL DEFAULT 0;

-- AlterTable
ALTER TABLE "nodes" ADD COLUMN     "credential_hash" TEXT,
ADD COLUMN     "gone_at" TIMESTAMPTZ(3),
ADD COLUMN     "lost_at" TIMESTAMPTZ(3),
ADD COLUMN     "reported_generation" INTEGER NOT NULL DEFAULT 0,
ADD COLUMN     "spec_generation" INTEGER NOT NULL DEFAULT 0;

-- CreateTable
CREATE TABLE "join_tokens" (
    "id" TEXT NOT NULL,
    "pool_id" TEXT NOT NULL,
    "token_hash" TEXT NOT NULL,
    "expires_at" TIMESTAMPTZ(3) NOT NULL,
    "used_at" TIMESTAMPTZ(3),
    "node_id" TEXT,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "join_tokens_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "orphans" (
    "node_id" TEXT NOT NULL,
    "domain_id" TEXT NOT NULL,
    "first_seen_at" TIMESTAMPTZ(3) NOT NULL,
    "removal_at" TIMESTAMPTZ(3),

    CONSTRAINT "orphans_pkey" PRIMARY KEY ("node_id","domain_id")
);

-- CreateIndex
CREATE UNIQUE INDEX "join_tokens_token_hash_key" ON "join_tokens"("token_hash");

-- CreateIndex
CREATE INDEX "instances_state_desired_state_idx" ON "instances"("state", "desired_state");

-- CreateIndex
CREATE UNIQUE INDEX "nodes_credential_hash_key" ON "nodes"("credential_hash");

-- AddForeignKey
ALTER TABLE "join_tokens" ADD CONSTRAINT "join_tokens_pool_id_fkey" FOREIGN KEY ("pool_id") REFERENCES "pools"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "orphans" ADD CONSTRAINT "orphans_node_id_fkey" FOREIGN KEY ("node_id") REFERENCES "nodes"("id") ON DELETE CASCADE ON UPDATE CASCADE;
