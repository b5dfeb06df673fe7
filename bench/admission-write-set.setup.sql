-- The tables bench/admission-write-set.sql writes, in a throwaway database of their own.
--
--   psql -v hosts=3 -v tenants=1 -f bench/admission-write-set.setup.sql <db>
--
-- Columns, defaults, constraints, indexes and foreign keys are those prisma/migrations gives the platform's tables
-- (as of migration 20261202043546_books), so rows are as wide and every write maintains as many index entries as
-- the platform's do. The tables admission only reads (flavors, images, projects) are left out: the write set
-- reads nothing it does not write. Fixture: one hosted pool with a /16 of addresses, `hosts` nodes with room for
-- more creates than any run makes, and `tenants` tenants with limits set on every resource, so each charge
-- really checks one (as the bench platform's fixture does). Identifiers are as long as the platform's.

CREATE TABLE tenants (
  id TEXT NOT NULL,
  name TEXT NOT NULL,
  created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  deleted_at TIMESTAMPTZ(3),
  CONSTRAINT tenants_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX tenants_name_key ON tenants (name);

CREATE TABLE pools (
  id TEXT NOT NULL,
  name TEXT NOT NULL,
  class TEXT NOT NULL,
  agent TEXT NOT NULL,
  runtime TEXT,
  provider_account_id TEXT,
  policy JSONB NOT NULL DEFAULT '{}',
  created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  CONSTRAINT pools_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX pools_name_key ON pools (name);

CREATE TABLE quota_limits (
  tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE ON UPDATE CASCADE,
  resource TEXT NOT NULL,
  "limit" BIGINT NOT NULL,
  CONSTRAINT quota_limits_pkey PRIMARY KEY (tenant_id, resource)
);

CREATE TABLE quota_usage (
  tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE ON UPDATE CASCADE,
  resource TEXT NOT NULL,
  used BIGINT NOT NULL DEFAULT 0,
  CONSTRAINT quota_usage_pkey PRIMARY KEY (tenant_id, resource),
  CONSTRAINT quota_usage_not_negative CHECK (used >= 0)
);

CREATE TABLE ip_pools (
  id TEXT NOT NULL,
  pool_id TEXT NOT NULL REFERENCES pools (id) ON DELETE CASCADE ON UPDATE CASCADE,
  cidr TEXT NOT NULL,
  network BIGINT NOT NULL,
  prefix INTEGER NOT NULL,
  gateway_offset INTEGER NOT NULL,
  CONSTRAINT ip_pools_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX ip_pools_pool_id_key ON ip_pools (pool_id);

CREATE TABLE ip_addresses (
  ip_pool_id TEXT NOT NULL REFERENCES ip_pools (id) ON DELETE CASCADE ON UPDATE CASCADE,
  "offset" INTEGER NOT NULL,
  address TEXT NOT NULL,
  instance_id TEXT,
  leased_at TIMESTAMPTZ(3),
  CONSTRAINT ip_addresses_pkey PRIMARY KEY (ip_pool_id, "offset")
);
CREATE UNIQUE INDEX ip_addresses_instance_id_key ON ip_addresses (instance_id);
CREATE INDEX ip_addresses_free_idx ON ip_addresses (ip_pool_id, "offset") WHERE instance_id IS NULL;

CREATE TABLE nodes (
  id TEXT NOT NULL,
  pool_id TEXT NOT NULL REFERENCES pools (id) ON DELETE CASCADE ON UPDATE CASCADE,
  name TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'ready',
  cap_vcpus INTEGER NOT NULL DEFAULT 0,
  cap_memory_mib BIGINT NOT NULL DEFAULT 0,
  cap_disk_gib BIGINT NOT NULL DEFAULT 0,
  alloc_vcpus INTEGER NOT NULL DEFAULT 0,
  alloc_memory_mib BIGINT NOT NULL DEFAULT 0,
  alloc_disk_gib BIGINT NOT NULL DEFAULT 0,
  alloc_instances INTEGER NOT NULL DEFAULT 0,
  dedicated_tenant_id TEXT,
  last_report_at TIMESTAMPTZ(3),
  created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  credential_hash TEXT,
  gone_at TIMESTAMPTZ(3),
  lost_at TIMESTAMPTZ(3),
  reported_generation INTEGER NOT NULL DEFAULT 0,
  spec_generation INTEGER NOT NULL DEFAULT 0,
  CONSTRAINT nodes_pkey PRIMARY KEY (id),
  CONSTRAINT nodes_alloc_within_capacity CHECK (
    alloc_vcpus >= 0 AND alloc_memory_mib >= 0 AND alloc_disk_gib >= 0 AND alloc_instances >= 0
    AND alloc_vcpus <= cap_vcpus AND alloc_memory_mib <= cap_memory_mib AND alloc_disk_gib <= cap_disk_gib)
);
CREATE UNIQUE INDEX nodes_pool_id_name_key ON nodes (pool_id, name);
CREATE UNIQUE INDEX nodes_credential_hash_key ON nodes (credential_hash);

CREATE TABLE instances (
  id TEXT NOT NULL,
  tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE ON UPDATE CASCADE,
  pool_id TEXT NOT NULL REFERENCES pools (id) ON DELETE RESTRICT ON UPDATE CASCADE,
  project_id TEXT,
  owner_identity_id TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  request_hash TEXT NOT NULL,
  flavor TEXT NOT NULL,
  vcpus INTEGER NOT NULL,
  memory_mib INTEGER NOT NULL,
  disk_gib INTEGER NOT NULL,
  gpus JSONB NOT NULL DEFAULT '[]',
  image_id TEXT NOT NULL,
  image_url TEXT,
  image_sha256 TEXT,
  image_format TEXT,
  image_verified BOOLEAN NOT NULL DEFAULT false,
  ssh_keys TEXT[],
  user_data_sealed BYTEA,
  runtime TEXT,
  state TEXT NOT NULL,
  desired_state TEXT NOT NULL,
  node_id TEXT,
  allocation_id TEXT,
  external_id TEXT,
  addresses TEXT[],
  conditions JSONB NOT NULL DEFAULT '[]',
  charge JSONB NOT NULL DEFAULT '{}',
  charge_released BOOLEAN NOT NULL DEFAULT false,
  version INTEGER NOT NULL DEFAULT 1,
  created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  attempts INTEGER NOT NULL DEFAULT 0,
  excluded_nodes TEXT[] DEFAULT ARRAY[]::TEXT[],
  observed_at TIMESTAMPTZ(3),
  observed_error TEXT,
  observed_generation INTEGER NOT NULL DEFAULT -1,
  observed_retryable BOOLEAN NOT NULL DEFAULT false,
  observed_shape JSONB,
  observed_state TEXT,
  retry_requested BOOLEAN NOT NULL DEFAULT false,
  spec_generation INTEGER NOT NULL DEFAULT 0,
  create_lease_until TIMESTAMPTZ(3),
  offer TEXT,
  claimed_at TIMESTAMPTZ(3),
  env JSONB NOT NULL DEFAULT '{}',
  network_policy JSONB,
  restore_from JSONB,
  sandbox_id TEXT,
  warm_template_id TEXT,
  warm_template_version INTEGER,
  CONSTRAINT instances_pkey PRIMARY KEY (id)
);
CREATE INDEX instances_tenant_id_owner_identity_id_created_at_idx ON instances (tenant_id, owner_identity_id, created_at);
CREATE INDEX instances_pool_id_state_idx ON instances (pool_id, state);
CREATE INDEX instances_node_id_idx ON instances (node_id);
CREATE INDEX instances_state_desired_state_idx ON instances (state, desired_state);
CREATE UNIQUE INDEX instances_sandbox_id_key ON instances (sandbox_id);
CREATE INDEX instances_warm_template_id_claimed_at_idx ON instances (warm_template_id, claimed_at);

CREATE TABLE instance_events (
  id BIGSERIAL NOT NULL,
  instance_id TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE ON UPDATE CASCADE,
  tenant_id TEXT NOT NULL,
  pool_id TEXT NOT NULL,
  project_id TEXT,
  from_state TEXT,
  to_state TEXT NOT NULL,
  desired_state TEXT NOT NULL,
  reason TEXT NOT NULL,
  actor TEXT NOT NULL,
  version INTEGER NOT NULL,
  at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  "position" BIGINT,
  CONSTRAINT instance_events_pkey PRIMARY KEY (id)
);
CREATE UNIQUE INDEX instance_events_instance_id_version_key ON instance_events (instance_id, version);
CREATE UNIQUE INDEX instance_events_position_key ON instance_events ("position");
CREATE INDEX instance_events_tenant_id_position_idx ON instance_events (tenant_id, "position");
CREATE INDEX instance_events_pool_id_position_idx ON instance_events (pool_id, "position");
CREATE SEQUENCE instance_events_position_seq AS BIGINT;

CREATE TABLE audit_log (
  id BIGSERIAL NOT NULL,
  at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  actor_id TEXT NOT NULL,
  tenant_id TEXT,
  action TEXT NOT NULL,
  target_id TEXT,
  request_id TEXT,
  details JSONB NOT NULL DEFAULT '{}',
  CONSTRAINT audit_log_pkey PRIMARY KEY (id)
);
CREATE INDEX audit_log_tenant_id_id_idx ON audit_log (tenant_id, id);

INSERT INTO pools (id, name, class, agent, runtime) VALUES ('pool_' || lpad('1', 26, '0'), 'bench', 'vps-host', 'bcd', 'libvirt-kvm');
-- 10.200.0.0/16 as createAddresses makes it: every offset but network, broadcast and the gateway (offset 1).
INSERT INTO ip_pools (id, pool_id, cidr, network, prefix, gateway_offset)
VALUES ('ipp_' || lpad('1', 26, '0'), 'pool_' || lpad('1', 26, '0'), '10.200.0.0/16', 180879360, 16, 1);
INSERT INTO ip_addresses (ip_pool_id, "offset", address)
SELECT 'ipp_' || lpad('1', 26, '0'), o, host('10.200.0.0'::inet + o) FROM generate_series(1, 65534) AS o WHERE o <> 1;

INSERT INTO nodes (id, pool_id, name, cap_vcpus, cap_memory_mib, cap_disk_gib, last_report_at)
SELECT 'node_' || lpad(h::text, 26, '0'), 'pool_' || lpad('1', 26, '0'), 'n' || h, 1000000000, 1000000000000, 1000000000000, now()
  FROM generate_series(1, :hosts) AS h;

INSERT INTO tenants (id, name) SELECT 'ten_' || lpad(t::text, 26, '0'), 'bench-' || t FROM generate_series(1, :tenants) AS t;
INSERT INTO quota_limits (tenant_id, resource, "limit")
SELECT 'ten_' || lpad(t::text, 26, '0'), r, 1000000000 FROM generate_series(1, :tenants) AS t, unnest(ARRAY['disk_gib', 'instances', 'memory_mib', 'vcpus']) AS r;
INSERT INTO quota_usage (tenant_id, resource, used)
SELECT 'ten_' || lpad(t::text, 26, '0'), r, 0 FROM generate_series(1, :tenants) AS t, unnest(ARRAY['disk_gib', 'instances', 'memory_mib', 'vcpus']) AS r;

VACUUM ANALYZE;
