-- CreateTable
CREATE TABLE "tenants" (
    "id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "tenants_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "identities" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT,
    "name" TEXT NOT NULL,
    "operator" BOOLEAN NOT NULL DEFAULT false,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "identities_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "api_tokens" (
    "id" TEXT NOT NULL,
    "identity_id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "token_hash" TEXT NOT NULL,
    "scopes" TEXT[],
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "expires_at" TIMESTAMPTZ(3),
    "revoked_at" TIMESTAMPTZ(3),

    CONSTRAINT "api_tokens_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "projects" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "projects_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "quota_limits" (
    "tenant_id" TEXT NOT NULL,
    "resource" TEXT NOT NULL,
    "limit" BIGINT NOT NULL,

    CONSTRAINT "quota_limits_pkey" PRIMARY KEY ("tenant_id","resource")
);

-- CreateTable
CREATE TABLE "quota_usage" (
    "tenant_id" TEXT NOT NULL,
    "resource" TEXT NOT NULL,
    "used" BIGINT NOT NULL DEFAULT 0,

    CONSTRAINT "quota_usage_pkey" PRIMARY KEY ("tenant_id","resource")
);

-- CreateTable
CREATE TABLE "provider_accounts" (
    "id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "provider" TEXT NOT NULL,
    "config" JSONB NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "provider_accounts_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "pools" (
    "id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "class" TEXT NOT NULL,
    "agent" TEXT NOT NULL,
    "runtime" TEXT,
    "provider_account_id" TEXT,
    "policy" JSONB NOT NULL DEFAULT '{}',
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "pools_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "ip_pools" (
    "id" TEXT NOT NULL,
    "pool_id" TEXT NOT NULL,
    "cidr" TEXT NOT NULL,
    "network" BIGINT NOT NULL,
    "prefix" INTEGER NOT NULL,
    "gateway_offset" INTEGER NOT NULL,

    CONSTRAINT "ip_pools_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "ip_addresses" (
    "ip_pool_id" TEXT NOT NULL,
    "offset" INTEGER NOT NULL,
    "address" TEXT NOT NULL,
    "instance_id" TEXT,
    "leased_at" TIMESTAMPTZ(3),

    CONSTRAINT "ip_addresses_pkey" PRIMARY KEY ("ip_pool_id","offset")
);

-- CreateTable
CREATE TABLE "nodes" (
    "id" TEXT NOT NULL,
    "pool_id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "state" TEXT NOT NULL DEFAULT 'ready',
    "cap_vcpus" INTEGER NOT NULL DEFAULT 0,
    "cap_memory_mib" BIGINT NOT NULL DEFAULT 0,
    "cap_disk_gib" BIGINT NOT NULL DEFAULT 0,
    "alloc_vcpus" INTEGER NOT NULL DEFAULT 0,
    "alloc_memory_mib" BIGINT NOT NULL DEFAULT 0,
    "alloc_disk_gib" BIGINT NOT NULL DEFAULT 0,
    "alloc_instances" INTEGER NOT NULL DEFAULT 0,
    "dedicated_tenant_id" TEXT,
    "last_report_at" TIMESTAMPTZ(3),
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "nodes_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "node_gpus" (
    "id" TEXT NOT NULL,
    "node_id" TEXT NOT NULL,
    "model" TEXT NOT NULL,
    "index" INTEGER NOT NULL,
    "pci_address" TEXT,
    "allocation_id" TEXT,

    CONSTRAINT "node_gpus_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "allocations" (
    "id" TEXT NOT NULL,
    "node_id" TEXT NOT NULL,
    "instance_id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "vcpus" INTEGER NOT NULL,
    "memory_mib" BIGINT NOT NULL,
    "disk_gib" BIGINT NOT NULL,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "allocations_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "flavors" (
    "id" TEXT NOT NULL,
    "pool_id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "vcpus" INTEGER NOT NULL,
    "memory_mib" INTEGER NOT NULL,
    "disk_gib" INTEGER NOT NULL,
    "gpus" JSONB NOT NULL DEFAULT '[]',
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updated_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "flavors_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "images" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT,
    "name" TEXT NOT NULL,
    "source" TEXT NOT NULL,
    "sha256" TEXT NOT NULL,
    "format" TEXT NOT NULL,
    "verified" BOOLEAN NOT NULL DEFAULT false,
    "visibility" TEXT NOT NULL DEFAULT 'private',
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "deleted_at" TIMESTAMPTZ(3),

    CONSTRAINT "images_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "instances" (
    "id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "pool_id" TEXT NOT NULL,
    "project_id" TEXT,
    "owner_identity_id" TEXT NOT NULL,
    "idempotency_key" TEXT NOT NULL,
    "request_hash" TEXT NOT NULL,
    "flavor" TEXT NOT NULL,
    "vcpus" INTEGER NOT NULL,
    "memory_mib" INTEGER NOT NULL,
    "disk_gib" INTEGER NOT NULL,
    "gpus" JSONB NOT NULL DEFAULT '[]',
    "image_id" TEXT NOT NULL,
    "image_url" TEXT,
    "image_sha256" TEXT,
    "image_format" TEXT,
    "image_verified" BOOLEAN NOT NULL DEFAULT false,
    "ssh_keys" TEXT[],
    "user_data_sealed" BYTEA,
    "runtime" TEXT,
    "state" TEXT NOT NULL,
    "desired_state" TEXT NOT NULL,
    "node_id" TEXT,
    "allocation_id" TEXT,
    "external_id" TEXT,
    "addresses" TEXT[],
    "conditions" JSONB NOT NULL DEFAULT '[]',
    "charge" JSONB NOT NULL DEFAULT '{}',
    "charge_released" BOOLEAN NOT NULL DEFAULT false,
    "version" INTEGER NOT NULL DEFAULT 1,
    "created_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updated_at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "instances_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "instance_events" (
    "id" BIGSERIAL NOT NULL,
    "instance_id" TEXT NOT NULL,
    "tenant_id" TEXT NOT NULL,
    "pool_id" TEXT NOT NULL,
    "project_id" TEXT,
    "from_state" TEXT,
    "to_state" TEXT NOT NULL,
    "desired_state" TEXT NOT NULL,
    "reason" TEXT NOT NULL,
    "actor" TEXT NOT NULL,
    "version" INTEGER NOT NULL,
    "at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,

    CONSTRAINT "instance_events_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "audit_log" (
    "id" BIGSERIAL NOT NULL,
    "at" TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "actor_id" TEXT NOT NULL,
    "tenant_id" TEXT,
    "action" TEXT NOT NULL,
    "target_id" TEXT,
    "request_id" TEXT,
    "details" JSONB NOT NULL DEFAULT '{}',

    CONSTRAINT "audit_log_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE UNIQUE INDEX "tenants_name_key" ON "tenants"("name");

-- CreateIndex
CREATE UNIQUE INDEX "api_tokens_token_hash_key" ON "api_tokens"("token_hash");

-- CreateIndex
CREATE UNIQUE INDEX "projects_tenant_id_name_key" ON "projects"("tenant_id", "name");

-- CreateIndex
CREATE UNIQUE INDEX "provider_accounts_name_key" ON "provider_accounts"("name");

-- CreateIndex
CREATE UNIQUE INDEX "pools_name_key" ON "pools"("name");

-- CreateIndex
CREATE UNIQUE INDEX "ip_pools_pool_id_key" ON "ip_pools"("pool_id");

-- CreateIndex
CREATE UNIQUE INDEX "ip_addresses_instance_id_key" ON "ip_addresses"("instance_id");

-- CreateIndex
CREATE UNIQUE INDEX "nodes_pool_id_name_key" ON "nodes"("pool_id", "name");

-- CreateIndex
CREATE INDEX "node_gpus_node_id_model_allocation_id_idx" ON "node_gpus"("node_id", "model", "allocation_id");

-- CreateIndex
CREATE UNIQUE INDEX "node_gpus_node_id_index_key" ON "node_gpus"("node_id", "index");

-- CreateIndex
CREATE UNIQUE INDEX "allocations_instance_id_key" ON "allocations"("instance_id");

-- CreateIndex
CREATE INDEX "allocations_node_id_idx" ON "allocations"("node_id");

-- CreateIndex
CREATE UNIQUE INDEX "flavors_pool_id_name_key" ON "flavors"("pool_id", "name");

-- CreateIndex
CREATE INDEX "images_tenant_id_idx" ON "images"("tenant_id");

-- CreateIndex
CREATE INDEX "instances_tenant_id_owner_identity_id_created_at_idx" ON "instances"("tenant_id", "owner_identity_id", "created_at");

-- CreateIndex
CREATE INDEX "instances_pool_id_state_idx" ON "instances"("pool_id", "state");

-- CreateIndex
CREATE INDEX "instances_node_id_idx" ON "instances"("node_id");

-- CreateIndex
CREATE INDEX "instance_events_tenant_id_id_idx" ON "instance_events"("tenant_id", "id");

-- CreateIndex
CREATE INDEX "instance_events_pool_id_id_idx" ON "instance_events"("pool_id", "id");

-- CreateIndex
CREATE UNIQUE INDEX "instance_events_instance_id_version_key" ON "instance_events"("instance_id", "version");

-- CreateIndex
CREATE INDEX "audit_log_tenant_id_id_idx" ON "audit_log"("tenant_id", "id");

-- AddForeignKey
ALTER TABLE "identities" ADD CONSTRAINT "identities_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "api_tokens" ADD CONSTRAINT "api_tokens_identity_id_fkey" FOREIGN KEY ("identity_id") REFERENCES "identities"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "projects" ADD CONSTRAINT "projects_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "quota_limits" ADD CONSTRAINT "quota_limits_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "quota_usage" ADD CONSTRAINT "quota_usage_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "pools" ADD CONSTRAINT "pools_provider_account_id_fkey" FOREIGN KEY ("provider_account_id") REFERENCES "provider_accounts"("id") ON DELETE SET NULL ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "ip_pools" ADD CONSTRAINT "ip_pools_pool_id_fkey" FOREIGN KEY ("pool_id") REFERENCES "pools"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "ip_addresses" ADD CONSTRAINT "ip_addresses_ip_pool_id_fkey" FOREIGN KEY ("ip_pool_id") REFERENCES "ip_pools"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "nodes" ADD CONSTRAINT "nodes_pool_id_fkey" FOREIGN KEY ("pool_id") REFERENCES "pools"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "node_gpus" ADD CONSTRAINT "node_gpus_node_id_fkey" FOREIGN KEY ("node_id") REFERENCES "nodes"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "node_gpus" ADD CONSTRAINT "node_gpus_allocation_id_fkey" FOREIGN KEY ("allocation_id") REFERENCES "allocations"("id") ON DELETE SET NULL ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "allocations" ADD CONSTRAINT "allocations_node_id_fkey" FOREIGN KEY ("node_id") REFERENCES "nodes"("id") ON DELETE RESTRICT ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "flavors" ADD CONSTRAINT "flavors_pool_id_fkey" FOREIGN KEY ("pool_id") REFERENCES "pools"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "images" ADD CONSTRAINT "images_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "instances" ADD CONSTRAINT "instances_tenant_id_fkey" FOREIGN KEY ("tenant_id") REFERENCES "tenants"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "instances" ADD CONSTRAINT "instances_pool_id_fkey" FOREIGN KEY ("pool_id") REFERENCES "pools"("id") ON DELETE RESTRICT ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "instance_events" ADD CONSTRAINT "instance_events_instance_id_fkey" FOREIGN KEY ("instance_id") REFERENCES "instances"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- Invariants the database itself enforces, behind the guarded updates of core/placement.ts and core/quota.ts:
-- a bug there fails a transaction instead of over-committing a host or losing quota.
ALTER TABLE "nodes" ADD CONSTRAINT "nodes_alloc_within_capacity" CHECK (
  alloc_vcpus >= 0 AND alloc_memory_mib >= 0 AND alloc_disk_gib >= 0 AND alloc_instances >= 0
  AND alloc_vcpus <= cap_vcpus AND alloc_memory_mib <= cap_memory_mib AND alloc_disk_gib <= cap_disk_gib);
ALTER TABLE "quota_usage" ADD CONSTRAINT "quota_usage_not_negative" CHECK (used >= 0);

-- Free addresses, lowest first, for leasing: a partial index Prisma's schema language cannot express.
CREATE INDEX "ip_addresses_free_idx" ON "ip_addresses" ("ip_pool_id", "offset") WHERE "instance_id" IS NULL;
