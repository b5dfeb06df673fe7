/**
 * SQL as values. `` SQL`SELECT … WHERE id = ${id}` `` is a Fragment: its text and the values it binds, whose
 * placeholders are numbered only when a whole statement is rendered (`text`, `params`). What is interpolated into
 * it is either another Fragment, inlined (its values numbered with the rest), or a value, which becomes a
 * parameter: a value never reaches the text. So a statement's text depends only on how it was put together, never
 * on the values it binds — which matters: statements are PREPAREd once per connection, keyed by their text
 * (infra/db/index.ts), and a text that varied with its values would prepare anew on every call.
 *
 * One Fragment interpolated twice into a statement binds its values once: both places name the same placeholders
 * (`SQL.param(v)`: a value named once and used in several places). A Fragment is a Statement, so Sql.query,
 * commitWith and batch take one as they are.
 *
 * Placeholders are numbered in the order they first appear in the rendered text. Text written by hand in a template
 * (or given to `raw`, `join`, `ident`) comes from the code, never from input; a `$1` in it is refused, so no
 * statement mixes numbered-by-hand placeholders with rendered ones.
 */
export class Fragment {
  private rendered: { text: string; params: unknown[] } | undefined;

  constructor(
    readonly strings: readonly string[],
    readonly values: readonly unknown[],
  ) {}

  /** The statement's text, its placeholders numbered from $1. */
  get text(): string {
    return this.render().text;
  }

  /** The values of $1, $2, … in the text. */
  get params(): unknown[] {
    return this.render().params;
  }

  private render(): { text: string; params: unknown[] } {
    if (!this.rendered) {
      const params: unknown[] = [];
      const text = build(this, params, new Map());
      this.rendered = { text, params };
    }
    return this.rendered;
  }
}

/** `f`'s text, its values appended to `params`; a Fragment met before in this statement is its text from then. */
function build(f: Fragment, params: unknown[], seen: Map<Fragment, string>): string {
  const known = seen.get(f);
  if (known !== undefined) return known;
  let text = f.strings[0] as string;
  for (let k = 0; k < f.values.length; k++) {
    const v = f.values[k];
    text += v instanceof Fragment ? build(v, params, seen) : `$${params.push(v)}`;
    text += f.strings[k + 1] as string;
  }
  seen.set(f, text);
  return text;
}

/** Template texts already checked for placeholders written by hand (one array per call site of the tag). */
const checked = new WeakSet<readonly string[]>();

function handWritten(strings: readonly string[]): readonly string[] {
  strings.forEach((s, k) => {
    // `$${v}` would make a `$$1` of the rendered placeholder.
    if (/\$\d/.test(s) || (k < strings.length - 1 && s.endsWith("$"))) throw new Error(`a placeholder written by hand in SQL: ${s.trim().slice(0, 80)}`);
  });
  return strings;
}

/** The tag: a Fragment of the template's text, its interpolations inlined (Fragments) or bound (any other value). */
export function SQL(strings: TemplateStringsArray, ...values: unknown[]): Fragment {
  if (!checked.has(strings)) checked.add(handWritten(strings));
  return new Fragment(strings, values);
}

/** Text from the code (a column list, a type name, a keyword), never from input. */
SQL.raw = (text: string): Fragment => new Fragment(handWritten([text]), []);

/** A value bound once, however often the Fragment is interpolated: one placeholder wherever it appears. */
SQL.param = (value: unknown): Fragment => new Fragment(["", ""], [value]);

/** `parts` one after another, `separator` (text from the code) between them; a part that is not a Fragment is bound. */
SQL.join = (parts: readonly unknown[], separator = ", "): Fragment => {
  if (!parts.length) return EMPTY;
  handWritten([separator]);
  return new Fragment(["", ...parts.slice(1).map(() => separator), ""], parts);
};

/** A plain lower-case identifier (a column, a WITH part's name), as it is: anything else is refused. */
SQL.ident = (name: string): Fragment => {
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`not a plain identifier: ${JSON.stringify(name)}`);
  return new Fragment([name], []);
};

const EMPTY = new Fragment([""], []);
/** Nothing: for a part a statement leaves out. */
SQL.empty = EMPTY;
