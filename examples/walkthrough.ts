// npx tsx examples/walkthrough.ts — against `npm start` (BC_URL and OPERATOR_TOKEN from what it printed)
import * as bc from "../sdk/client.ts";

const url = process.env.BC_URL ?? "http://127.0.0.1:4000/graphql";
const op = bc.createClient({ url, token: process.env.OPERATOR_TOKEN });
const { createTenant: tenant } = await op.request(bc.CreateTenantDocument, { input: { name: "acme", quota: { vcpus: 64 } } });
const {
  createApiToken: { token },
} = await op.request(bc.CreateApiTokenDocument, { input: { tenantId: tenant.id, name: "laptop" } });
const { createPool: pool } = await op.request(bc.CreatePoolDocument, { input: { name: "home", class: "VPS_HOST", ipv4Range: "10.42.0.0/24" } });
await op.request(bc.CreateNodeDocument, { input: { poolId: pool.id, name: "box-1", capacity: { vcpus: 16, memoryMib: 65536, diskGib: 500 } } });
await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 } });
const { registerImage: image } = await op.request(bc.RegisterImageDocument, {
  input: {
    name: "debian-12",
    source: "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2",
    sha256: "0".repeat(64),
    format: "QCOW2",
    public: true,
  },
});
const me = bc.createClient({ url, token });
const { createInstance: vm } = await me.request(bc.CreateInstanceDocument, {
  input: { poolId: pool.id, flavor: "small", imageId: image.id, idempotencyKey: "first-vm" },
});
console.log(`${vm.id} ${vm.state} on ${vm.nodeId} at ${vm.addresses.join(", ")}`);
