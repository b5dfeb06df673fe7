-- AlterTable
ALTER TABLE "provider_accounts" ADD COLUMN     "check_error" TEXT,
ADD COLUMN     "check_error_kind" TEXT,
ADD COLUMN     "checked_at" TIMESTAMPTZ(3);
