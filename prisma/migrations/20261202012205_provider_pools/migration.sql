-- AlterTable
ALTER TABLE "instances" ADD COLUMN     "create_lease_until" TIMESTAMPTZ(3),
ADD COLUMN     "offer" TEXT;

-- AlterTable
ALTER TABLE "provider_accounts" ADD COLUMN     "credentials" JSONB NOT NULL DEFAULT '{}';

-- CreateTable
CREATE TABLE "provider_offers" (
    "account_id" TEXT NOT NULL,
    "name" TEXT NOT NULL,
    "vcpus" INTEGER NOT NULL,
    "memory_mib" INTEGER NOT NULL,
    "disk_gib" INTEGER NOT NULL,
    "refreshed_at" TIMESTAMPTZ(3) NOT NULL,

    CONSTRAINT "provider_offers_pkey" PRIMARY KEY ("account_id","name")
);

-- CreateTable
CREATE TABLE "provider_orphans" (
    "account_id" TEXT NOT NULL,
    "external_id" TEXT NOT NULL,
    "instance_id" TEXT,
    "first_seen_at" TIMESTAMPTZ(3) NOT NULL,

    CONSTRAINT "provider_orphans_pkey" PRIMARY KEY ("account_id","external_id")
);

-- AddForeignKey
ALTER TABLE "provider_offers" ADD CONSTRAINT "provider_offers_account_id_fkey" FOREIGN KEY ("account_id") REFERENCES "provider_accounts"("id") ON DELETE CASCADE ON UPDATE CASCADE;

-- AddForeignKey
ALTER TABLE "provider_orphans" ADD CONSTRAINT "provider_orphans_account_id_fkey" FOREIGN KEY ("account_id") REFERENCES "provider_accounts"("id") ON DELETE CASCADE ON UPDATE CASCADE;
