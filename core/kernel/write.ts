import type { InstanceEventMessage } from "../../contracts/channels.ts";
import type { HostCommand } from "../../contracts/host.ts";
import type { Sql } from "./db.ts";
import type { IdSource } from "./ids.ts";
import { type Fragment, SQL } from "./sql.ts";

/**
 * The one write path (docs/architecture.md, "The write path"). Every change — a mutation, a reconciler step,
 * the sweep, a host's report — runs as one `Write`: a transaction plus what it must announce once committed.
 * Domain functions take the Write, change rows through `sql`, and record on it the instance events they wrote,
 * the reconciler wake-ups, the nodes whose spec generation they bumped, revoked credentials and hosts with new
 * commands. The runner (infra/platform.ts) commits, then applies those effects; a rollback applies none.
 *
 * A mutation also names the subject of its audit row (`audit`) or says it changed nothing (`unchanged`): the
 * runner writes exactly one audit row for it, in the same transaction, and refuses to commit a mutation that
 * did neither, so no mutation can skip the audit trail by omission.
 */
export interface WriteOptions {
  /** Who acts: an identity id, `reconciler`, `sweep`, `node:<id>`. */
  actor: string;
  requestId?: string | null;
  /** Set for mutations: the mutation's name, which becomes the audit row's action. */
  action?: string;
}

export interface AuditSubject {
  targetId: string;
  tenantId?: string | null;
  details?: unknown;
}

/**
 * A write that lost a race it could not wait out in its own statement: the runner runs the whole write again
 * (as it does for the database's own serialization failures, whose code this carries), and `attempt` tells
 * the domain it is a retry.
 */
/** The audit row's columns, in the order both of its writers (finishWrite, auditInStatement) give values. */
const AUDIT_COLUMNS = SQL`actor_id, tenant_id, action, target_id, request_id, details, at`;

/**
 * What an event's row holds beyond its bus message, and its instance as the write left it: enough for this
 * process's own live feed to hand the event to its subscribers without reading it back (infra/platform.ts).
 */
export interface EventDetail {
  desiredState: string;
  reason: string;
  actor: string;
  at: Date;
  instance: object;
}

export class ContendedWrite extends Error {
  readonly code = "40001";
  /**
   * A first attempt built on a guess that did not hold (core/lifecycle/power-requests.ts; admission's remembered catalog): run
   * again as planned, counted apart from contention, and not taken from the write's retries.
   */
  readonly guess: boolean;

  constructor(message: string, opts: { guess?: boolean } = {}) {
    super(message);
    this.guess = opts.guess ?? false;
  }
}

export class Write {
  readonly events: InstanceEventMessage[] = [];
  /** Per event, what it says beyond its message (not published: the bus carries hints, the table the rest). */
  readonly eventDetails = new Map<InstanceEventMessage, EventDetail>();
  readonly wakes = new Set<string>();
  /** Node → the newest spec generation this write gave it. */
  readonly specs = new Map<string, number>();
  readonly revoked: string[] = [];
  /** Node → the host commands this write queued for it. */
  readonly commandsFor = new Map<string, HostCommand[]>();
  /** Sandbox templates or sandboxes changed: the sandboxes reconciler (warm pools, deadlines) runs once committed. */
  sandboxes: { delayMs: number } | null = null;
  /** Provider accounts whose offers and machines the worker should read again. */
  readonly providerAccounts = new Set<string>();
  private subject: AuditSubject | null = null;
  private noChange = false;
  private readonly looks = new Map<string, Promise<unknown>>();

  constructor(
    readonly sql: Sql,
    readonly ids: IdSource,
    readonly now: Date,
    readonly opts: WriteOptions,
    /** 1, or which retry of the write this is (after a deadlock, a serialization failure, a ContendedWrite). */
    readonly attempt = 1,
  ) {}

  get actor(): string {
    return this.opts.actor;
  }

  /**
   * A read this write makes once and then reuses: for facts its steps may all take as of its first look (a
   * reconcile pass asks after the instance's node at every step; one look serves the pass).
   */
  look<T>(key: string, read: () => Promise<T>): Promise<T> {
    let seen = this.looks.get(key) as Promise<T> | undefined;
    if (!seen) {
      seen = read();
      this.looks.set(key, seen);
    }
    return seen;
  }

  /** An instance event this transaction inserted (changes.ts does this for every instance change). */
  event(e: InstanceEventMessage, detail?: EventDetail): void {
    this.events.push(e);
    if (detail) this.eventDetails.set(e, detail);
    this.wakes.add(e.instanceId);
  }

  /** Reconcile this instance once committed. */
  wake(instanceId: string): void {
    this.wakes.add(instanceId);
  }

  /** Instances a reconcile pass in this write took as far as they go without news: no wake-up for them. */
  readonly settled = new Set<string>();

  /**
   * This write's reconcile pass took every step the instance allows until something else changes: its own
   * events need not wake it again (a pass then would find nothing). Wake-ups of other writes are untouched.
   */
  settle(instanceId: string): void {
    this.settled.add(instanceId);
  }

  /** A node's desired set changed: its agent hears of the new generation once committed. */
  spec(nodeId: string, generation: number): void {
    this.specs.set(nodeId, Math.max(generation, this.specs.get(nodeId) ?? generation));
  }

  /** Live connections authenticated by this credential (`tok:<id>`, `node:<id>`) end once committed. */
  revoke(key: string): void {
    this.revoked.push(key);
  }

  /** A host command queued for a node: its agent is sent it once committed. */
  command(nodeId: string, command: HostCommand): void {
    this.commandsFor.set(nodeId, [...(this.commandsFor.get(nodeId) ?? []), command]);
  }

  /** Exec commands with new output (or a final word): their watchers look once committed. */
  readonly execOutputs = new Set<string>();

  execOutput(commandId: string): void {
    this.execOutputs.add(commandId);
  }

  /** Sandbox deadlines to wake at (sandbox id → time). */
  readonly deadlines = new Map<string, Date>();

  /** A sandbox's deadline was set: its expiry job is enqueued to run then. */
  deadline(sandboxId: string, at: Date): void {
    this.deadlines.set(sandboxId, at);
  }

  /** Warm pools or deadlines changed: the sandboxes reconciler looks once committed. */
  wakeSandboxes(delayMs = 0): void {
    this.sandboxes = { delayMs: Math.min(delayMs, this.sandboxes?.delayMs ?? delayMs) };
  }

  /** Tenants being deleted: their teardown (`vps.tenants`) runs once committed. */
  readonly tenantsToTearDown = new Set<string>();

  tearDown(tenantId: string): void {
    this.tenantsToTearDown.add(tenantId);
  }

  /** A provider account is new or changed: the worker reads its offers (and machines) once committed. */
  wakeProviders(accountId: string): void {
    this.providerAccounts.add(accountId);
  }

  /** What this mutation changed: the subject of its one audit row. Writes that are not mutations keep none. */
  audit(subject: AuditSubject): void {
    if (!this.opts.action) return;
    if (this.closed) throw new Error(`${this.opts.action} named its audit subject after its last statement was sent`);
    if (this.subject) throw new Error(`${this.opts.action} named two audit subjects (${this.subject.targetId}, ${subject.targetId})`);
    this.subject = subject;
  }

  private auditWritten = false;

  /**
   * `audit`, with the row inserted by the caller's own last statement (admission's, whose node and addresses
   * are only known inside it): the INSERT for a CTE, reading `from`; `details` is a jsonb SQL expression over
   * `from`. The caller must fail the write if the statement did not insert it. Null for a write that is not a
   * mutation (it keeps no audit row).
   */
  auditInStatement(subject: Omit<AuditSubject, "details">, details: Fragment, from: Fragment): Fragment | null {
    if (!this.opts.action) return null;
    // That statement commits the write: nothing deferred could follow it.
    if (this.deferred.length) throw new Error("a write that commits in its own statement cannot defer statements");
    this.audit(subject);
    this.auditWritten = true;
    const action = this.opts.action as string;
    return SQL`INSERT INTO audit_log (${AUDIT_COLUMNS})
       SELECT ${this.actor}, ${subject.tenantId ?? null}, ${action}, ${subject.targetId}, ${this.opts.requestId ?? null}, ${details}, ${this.now}::timestamptz
         FROM ${from}`;
  }

  /**
   * Statements whose rows nothing later in this write reads, sent as part of its last statement (finishWrite):
   * a round trip less for the caller waiting on the write.
   */
  readonly deferred: Fragment[] = [];

  defer(statement: Fragment): void {
    if (this.closed) throw new Error("this write's last statement was sent: nothing can be deferred to it");
    this.deferred.push(statement);
  }

  /** The write's last statement has been sent (closingParts): the write takes no more. */
  private closed = false;

  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * What the write's last statement must also do — its deferred statements and the mutation's audit row — as
   * WITH parts (named d0…, a) for a caller whose own statement is that last one (writeChange's `last`). After it
   * the write is closed: no more deferring or auditing, and finishWrite sends nothing.
   */
  closingParts(): Fragment[] {
    const row = this.auditRow();
    const parts = this.deferred.map((statement, k) => SQL`${SQL.ident(`d${k}`)} AS (${statement})`);
    if (row) parts.push(SQL`a AS (${auditInsert(this, row)})`);
    this.closed = true;
    return parts;
  }

  /** This mutation changed nothing (a replay, a repeated request): it writes no audit row. */
  unchanged(): void {
    this.noChange = true;
  }

  /** The audit row this write owes, or null; throws for a mutation that said neither what nor that nothing changed. */
  auditRow(): (AuditSubject & { action: string }) | null {
    const action = this.opts.action;
    if (!action || this.auditWritten) return null;
    if (this.subject) return { ...this.subject, action };
    if (this.noChange) return null;
    throw new Error(`mutation ${action} finished without naming its audit subject or saying it changed nothing`);
  }
}

/** The INSERT of a mutation's audit row. */
function auditInsert(w: Write, row: AuditSubject & { action: string }): Fragment {
  return SQL`INSERT INTO audit_log (${AUDIT_COLUMNS}) VALUES (${w.actor}, ${row.tenantId ?? null}, ${row.action}, ${row.targetId},
         ${w.opts.requestId ?? null}, ${JSON.stringify(row.details ?? {})}::jsonb, ${w.now})`;
}

/** The write's last statement as finishWrite sends it: what closingParts gives, or null when that is nothing. */
export function closingStatement(w: Write): Fragment | null {
  const parts = w.closingParts();
  return parts.length ? SQL`WITH ${SQL.join(parts)} SELECT 1` : null;
}

/**
 * The transaction's last statement: the mutation's audit row, if it owes one, with what the write deferred.
 * Nothing when a statement of the write's own was its last (closingParts).
 */
export async function finishWrite(w: Write): Promise<void> {
  if (w.isClosed) return;
  // The write's last statement: where the database can, it goes with COMMIT in one message (a round trip less
  // for every audited write, and its rows' locks given back that much sooner). Deferred statements ride in it
  // (PostgreSQL runs every data-modifying WITH part once, whether or not the statement reads it).
  const statement = closingStatement(w);
  if (!statement) return;
  const last = w.sql.commitWith?.bind(w.sql) ?? w.sql.query.bind(w.sql);
  await last(statement);
}

/**
 * Once committed: positions for this write's instance events, from the sequencer (infra/sequencer.ts; the
 * sequenced_positions migration gives committed events positions in commit order, outside any writer's
 * transaction, so a reader that sees position p has seen every event before it). Cursors are positions, so the
 * bus messages carry them.
 */
export async function positionEvents(w: Write, sequence: (eventIds: readonly string[]) => Promise<Map<string, string>>): Promise<void> {
  if (!w.events.length) return;
  const positions = await sequence(w.events.map((e) => e.cursor));
  for (const e of w.events) e.cursor = positions.get(e.cursor) as string;
}

/** Position events whose writer committed them and died before asking (the sweep's backstop). */
export async function positionStragglers(sql: Sql): Promise<void> {
  await sql.query(`SELECT count(*) FROM sequence_instance_events('{}'::bigint[], true)`);
}
