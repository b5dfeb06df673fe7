-- The least write set of a hosted create, as one pgbench transaction: what PostgreSQL itself allows admission
-- on the same hot rows (bench/admission.ts prints creates/s as a ratio of it). Tables: admission-write-set.setup.sql.
--
--   pgbench -n -M prepared -f bench/admission-write-set.sql -D n=0 -D hosts=3 -D tenants=1 \
--           -D vcpus=1 -D memory_mib=512 -D disk_gib=5 <db>
--
-- Per create: a guarded claim on one host's counters, an address lease, the instance row, its first event, its
-- audit row, and a guarded charge of the tenant's quota rows. Nothing else: no reads beyond what the writes
-- need, no allocation or meter-span row (the instance row says where it runs and what it holds), no second
-- pass over the event to order it. One statement, so one round trip; the charge is made last (every create of
-- a tenant queues on those rows) and everything after a failed guard is empty, which the final SELECT turns
-- into an error that aborts the pgbench client instead of counting a create that did not happen.
--
-- Host choice as placement.ts makes it: the fullest node that fits and that no other create holds (SKIP
-- LOCKED); with all of them held, one chosen at random, waited for, and its fit checked again on the row it got.

\set n :n + 1
\set t random(1, :tenants)
\set h random(1, :hosts)
WITH
  me AS (
    SELECT 'inst_' || substr(md5(:client_id::text || '.' || :n::text) || md5(:n::text || '.' || :client_id::text), 1, 52) AS id,
           'ten_' || lpad(:t::text, 26, '0') AS tenant, 'idn_' || lpad(:t::text, 26, '0') AS identity,
           'pool_' || lpad('1', 26, '0') AS pool, 'ipp_' || lpad('1', 26, '0') AS ip_pool,
           'node_' || lpad(:h::text, 26, '0') AS any_node, 'alloc_' || substr(md5(:n::text || '/' || :client_id::text), 1, 26) AS allocation,
           :vcpus::int AS vcpus, :memory_mib::int AS memory_mib, :disk_gib::int AS disk_gib, now() AS at),
  pick AS (
    SELECT COALESCE(
             (SELECT n.id FROM nodes n
               WHERE n.pool_id = me.pool AND n.state = 'ready' AND n.lost_at IS NULL AND n.gone_at IS NULL
                 AND n.cap_vcpus - n.alloc_vcpus >= me.vcpus AND n.cap_memory_mib - n.alloc_memory_mib >= me.memory_mib
                 AND n.cap_disk_gib - n.alloc_disk_gib >= me.disk_gib
               ORDER BY n.cap_memory_mib - n.alloc_memory_mib, n.id LIMIT 1 FOR UPDATE SKIP LOCKED),
             me.any_node) AS id
      FROM me),
  node AS (
    UPDATE nodes n SET alloc_vcpus = n.alloc_vcpus + me.vcpus, alloc_memory_mib = n.alloc_memory_mib + me.memory_mib,
           alloc_disk_gib = n.alloc_disk_gib + me.disk_gib, alloc_instances = n.alloc_instances + 1
      FROM pick, me
     WHERE n.id = pick.id AND n.state = 'ready' AND n.lost_at IS NULL AND n.gone_at IS NULL
       AND n.cap_vcpus - n.alloc_vcpus >= me.vcpus AND n.cap_memory_mib - n.alloc_memory_mib >= me.memory_mib
       AND n.cap_disk_gib - n.alloc_disk_gib >= me.disk_gib
    RETURNING n.id),
  lease AS (
    UPDATE ip_addresses a SET instance_id = me.id, leased_at = me.at
      FROM me
     WHERE a.ip_pool_id = me.ip_pool AND a."offset" = (
             SELECT f."offset" FROM ip_addresses f WHERE f.ip_pool_id = me.ip_pool AND f.instance_id IS NULL
              ORDER BY f."offset" LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING a.address),
  inst AS (
    INSERT INTO instances (id, tenant_id, pool_id, project_id, owner_identity_id, idempotency_key, request_hash, flavor, vcpus,
      memory_mib, disk_gib, gpus, image_id, image_url, image_sha256, image_format, image_verified, ssh_keys, user_data_sealed,
      runtime, state, desired_state, node_id, allocation_id, addresses, charge, offer, sandbox_id, warm_template_id,
      warm_template_version, env, network_policy, restore_from, version, created_at, updated_at)
    SELECT me.id, me.tenant, me.pool, NULL, me.identity, 'wset-' || :client_id::text || '-' || :n::text, md5(me.id) || md5(me.allocation),
           'small', me.vcpus, me.memory_mib, me.disk_gib, '[]'::jsonb, 'img_' || lpad('1', 26, '0'), 'https://images.invalid/i.qcow2',
           repeat('a', 64), 'qcow2', false, ARRAY[]::text[], NULL, 'libvirt-kvm', 'pending', 'running', node.id, me.allocation,
           ARRAY[lease.address],
           jsonb_build_object('instances', 1, 'vcpus', me.vcpus, 'memory_mib', me.memory_mib, 'disk_gib', me.disk_gib),
           NULL, NULL, NULL, NULL, '{}'::jsonb, NULL, NULL, 1, me.at, me.at
      FROM me, node, lease
    RETURNING id, tenant_id, pool_id, project_id, state, desired_state, node_id, addresses),
  event AS (
    INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at, "position")
    SELECT inst.id, inst.tenant_id, inst.pool_id, inst.project_id, NULL, inst.state, inst.desired_state, 'created', me.identity, 1, me.at,
           nextval('instance_events_position_seq')
      FROM inst, me
    RETURNING id),
  audit AS (
    INSERT INTO audit_log (actor_id, tenant_id, action, target_id, request_id, details, at)
    SELECT me.identity, inst.tenant_id, 'createInstance', inst.id, NULL,
           jsonb_build_object('poolId', inst.pool_id,
             'flavor', jsonb_build_object('vcpus', me.vcpus, 'memoryMib', me.memory_mib, 'diskGib', me.disk_gib, 'gpus', '[]'::jsonb),
             'nodeId', inst.node_id, 'addresses', to_jsonb(inst.addresses), 'offer', NULL),
           me.at
      FROM inst, me
    RETURNING id),
  charged AS (
    UPDATE quota_usage u SET used = u.used + w.amount
      FROM me, (VALUES ('disk_gib', :disk_gib::bigint), ('instances', 1::bigint), ('memory_mib', :memory_mib::bigint), ('vcpus', :vcpus::bigint)) AS w(resource, amount)
     WHERE u.tenant_id = me.tenant AND u.resource = w.resource
       AND u.used + w.amount <= COALESCE((SELECT l."limit" FROM quota_limits l WHERE l.tenant_id = me.tenant AND l.resource = w.resource), u.used + w.amount)
       AND EXISTS (SELECT FROM event) AND EXISTS (SELECT FROM audit)
    RETURNING u.resource)
SELECT 1 / ((SELECT count(*) FROM charged) = 4)::int AS admitted;
