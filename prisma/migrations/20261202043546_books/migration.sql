-- AlterTable
ALTER TABLE "provider_accounts" ADD COLUMN     "check_error" TEXT,
ADD COLUMN     "check_error_kind" TEXT,
ADD COLUMN     "checked_at" TIMESTAMPTZ(3);

-- AlterTable
ALTER TABLE "tenants" ADD COLUMN     "deleted_at" TIMESTAMPTZ(3);

-- CreateTable
CREATE TABLE "meter_spans" (
    "id" TEXT NOT NULL,
    "allocation_id" TEXT NOT NULL,
    "instance_id" TEXT NOT NULL,
    "tenant_id" TEXT,
    "project_id" TEXT,
    "warm" BOOLEAN NOT NULL DEFAULT false,
    "vcpus" INTEGER NOT NULL,
    "memory_mib" BIGINT NOT NULL,
    "gpus" JSONB NOT NULL DEFAULT '[]',
    "started_at" TIMESTAMPTZ(3) NOT NULL,
    "ended_at" TIMESTAMPTZ(3),
    "metered_until" TIMESTAMPTZ(3) NOT NULL,

    CONSTRAINT "meter_spans_pkey" PRIMARY KEY ("id")
);

-- CreateTable
CREATE TABLE "usage_windows" (
    "window_start" TIMESTAMPTZ(3) NOT NULL,
    "metered_at" TIMESTAMPTZ(3) NOT NULL,

    CONSTRAINT "usage_windows_pkey" PRIMARY KEY ("window_start")
);

-- CreateTable
CREATE TABLE "usage_records" (
    "id" BIGSERIAL NOT NULL,
    "window_start" TIMESTAMPTZ(3) NOT NULL,
    "meter" TEXT NOT NULL,
    "tenant_id" TEXT,
    "project_id" TEXT,
    "instance_id" TEXT NOT NULL,
    "amount" BIGINT NOT NULL,

    CONSTRAINT "usage_records_pkey" PRIMARY KEY ("id")
);

-- CreateIndex
CREATE INDEX "meter_spans_allocation_id_idx" ON "meter_spans"("allocation_id");

-- CreateIndex
CREATE INDEX "meter_spans_metered_until_idx" ON "meter_spans"("metered_until");

-- CreateIndex
CREATE INDEX "usage_records_window_start_idx" ON "usage_records"("window_start");

-- CreateIndex
CREATE INDEX "usage_records_tenant_id_window_start_idx" ON "usage_records"("tenant_id", "window_start");
