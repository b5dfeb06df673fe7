-- AlterTable
ALTER TABLE "host_commands" ADD COLUMN     "error_code" TEXT;
