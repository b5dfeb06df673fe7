/**
 * What `make` gives for an object and a key, made once while the object lives: the object's entries go with it
 * (a WeakMap of Maps). For per-event results in the live path and per-document costs in the limits.
 */
export function onceFor<T>(cache: WeakMap<object, Map<string, T>>, owner: object, key: string, make: () => T): T {
  let byKey = cache.get(owner);
  if (!byKey) {
    byKey = new Map();
    cache.set(owner, byKey);
  }
  let value = byKey.get(key);
  if (value === undefined) {
    value = make();
    byKey.set(key, value);
  }
  return value;
}
