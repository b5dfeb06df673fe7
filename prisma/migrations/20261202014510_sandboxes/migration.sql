-- AlterTable
ALTER TABLE "instances" ADD COLUMN     "claimed_at" TIMESTAMPTZ(3),
ADD COLUMN     "env" JSONB NOT NULL DEFAULT '{}',
ADD COLUMN     "network_policy" JSONB,
ADD COLUMN     "restore_from" JSONB,
ADD COLUMN     "sandbox_id" TEXT,
ADD COLUMN     "warm_template_id" TEXT,
ADD COLUMN     "warm_template_version" INTEGER;

-- CreateTable
CREATE TABLE "sandbox_templates" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "version" INTEGER NOT NULL DEFAULT 1,
    "pool_id" TEXT NOT NULL,
    "flavor" TEXT NOT NULL,
    "image_id" TEXT NOT NULL,
    "env" JSONB NOT NULL DEFAULT '[]',
    "network" JSONB NOT NULL,
    "ttl_seconds" INTEGER NOT NULL,
    "max_ttl_seconds" INTEGER NOT NULL,
    "warm_target" INTEGER NOT NULL,
    "created_by" TEXT NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updated_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "sandbox_templates_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "sandboxes" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "owner_identity_id" TEXT NOT NULL,
    "template_id" TEXT,
    "template_version" INTEGER,
    "from_snapshot_id" TEXT,
    "instance_id" TEXT NOT NULL,
    "idempotency_key" TEXT NOT NULL,
    "request_hash" TEXT NOT NULL,
    "ttl_seconds" INTEGER NOT NULL,
    "max_ttl_seconds" INTEGER NOT NULL,
    "expires_at" TIMESTAMPTZ(3) NOT NULL,
    "warm" BOOLEAN NOT NULL DEFAULT false,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "sandboxes_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "sandbox_snapshots" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "sandbox_id" TEXT NOT NULL,
    "instance_id" TEXT NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "deleted_at" TIMESTAMPTZ(3),

    CONSTRAINT "sandbox_snapshots_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "exec_output" (
    "command_id" TEXT NOT NULL,
    "seq" INTEGER NOT NULL,
    "stream" TEXT NOT NULL,
    "data" TEXT NOT NULL,
    "at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "exec_output_pkey" PRIMARY KEY ("command_id","seq")
);

-- CreateIndex
CREATE UNIQUE INDEX "sandbox_templates_tenant_id_name_key" ON "sandbox_templates"("tenant_id", "name");

-- CreateIndex
CREATE UNIQUE INDEX "sandboxes_instance_id_key" ON "sandboxes"("instance_id");

-- CreateIndex
CREATE INDEX "sandboxes_expires_at_idx" ON "sandboxes"("expires_at");

-- CreateIndex
CREATE UNIQUE INDEX "sandboxes_tenant_id_owner_identity_id_idempotency_key_key" ON "sandboxes"("tenant_id", "owner_identity_id", "idempotency_key");

-- CreateIndex
CREATE INDEX "sandbox_snapshots_sandbox_id_idx" ON "sandbox_snapshots"("sandbox_id");

-- CreateIndex
CREATE UNIQUE INDEX "instances_sandbox_id_key" ON "instances"("sandbox_id");

-- CreateIndex
CREATE INDEX "instances_warm_template_id_claimed_at_idx" ON "instances"("warm_template_id", "claimed_at");

-- AddForeignKey
ALTER TABLE "sandbox_templates" ADD CONSTRAINT "sandbox_templates_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "sandboxes" ADD CONSTRAINT "sandboxes_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "sandbox_snapshots" ADD CONSTRAINT "sandbox_snapshots_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;
