// What another operator changed: the fields that differ between the copy
// the console wrote against and the current one the server answered a 412
// VERSION_CONFLICT with. Pure, so node can test it.

// VOLATILE are fields that move without a version change (live figures,
// the clock): they are not an operator's change.
const VOLATILE = new Set(['queue', 'figures', 'remaining', 'sold', 'paid', 'expired', 'cancelled', 'rejected', 'soldOut', 'serverTimeMs', 'updatedAt']);

// flatten maps every leaf of a JSON value to its dotted path
// ("items.0.quantity"); arrays are indexed, empty objects and arrays are
// leaves.
export function flatten(v, prefix = '', out = new Map()) {
  if (v !== null && typeof v === 'object' && Object.keys(v).length > 0) {
    for (const [k, x] of Object.entries(v)) {
      if (VOLATILE.has(k)) continue;
      flatten(x, prefix ? prefix + '.' + k : k, out);
    }
  } else if (prefix) {
    out.set(prefix, v !== null && typeof v === 'object' ? JSON.stringify(v) : v);
  }
  return out;
}

// conflictChanges lists {path, was, now} for every differing leaf, the
// version first, then in the current document's order, then the removed.
export function conflictChanges(mine, current) {
  const a = flatten(mine || {});
  const b = flatten(current || {});
  const out = [];
  for (const [path, now] of b) {
    const was = a.get(path);
    if (!a.has(path) || was !== now) out.push({ path, was: a.has(path) ? was : undefined, now });
  }
  for (const [path, was] of a) if (!b.has(path)) out.push({ path, was, now: undefined });
  out.sort((x, y) => (y.path === 'version') - (x.path === 'version'));
  return out;
}
