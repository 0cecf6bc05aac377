// What another operator changed: the fields that differ between the copy
// the console wrote against and the current one the server answered a 412
// VERSION_CONFLICT with. Pure, so node can test it.

// VOLATILE are fields that move without a version change (live figures,
// the clock): they are not an operator's change.
const VOLATILE = new Set(['queue', 'figures', 'remaining', 'sold', 'paid', 'expired', 'cancelled', 'rejected', 'soldOut', 'serverTimeMs', 'updatedAt']);

// isList reports an array of plain values (a blocklist), which reads as one
// value, "1, 2", rather than one path per index.
const isList = (v) => Array.isArray(v) && v.every((x) => x === null || typeof x !== 'object');

// flatten maps every leaf of a JSON value to its dotted path
// ("items.0.quantity"); arrays of objects are indexed, arrays of plain
// values are one leaf ("1, 2"; empty is ''), empty objects are leaves.
export function flatten(v, prefix = '', out = new Map()) {
  if (isList(v) && prefix) {
    out.set(prefix, v.join(', '));
  } else if (v !== null && typeof v === 'object' && Object.keys(v).length > 0) {
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

// changeLines describes an audited change as a person reads it: one line
// per value that changed between before and after, {path, was, now}; for a
// body that is not a before/after pair, one line per value, {path, value}.
// line words each (by default "path: was → now" and "path: value", – for
// a value that was not there, is gone or is empty). At most max lines, the
// last one then saying how many more there were (more(n)).
export function changeLines(body, max, more, line = plainLine) {
  if (body === undefined || body === null) return [];
  if (typeof body !== 'object') return [String(body)];
  let lines;
  if (Object.keys(body).length === 2 && 'before' in body && 'after' in body) {
    lines = conflictChanges(body.before || {}, body.after || {}).map(line);
  } else {
    lines = [...flatten(body)].map(([path, value]) => line({ path, value }));
  }
  if (lines.length > max) {
    const n = lines.length - max + 1;
    lines = lines.slice(0, max - 1);
    lines.push(more(n));
  }
  return lines.map((l) => (l.length > 200 ? l.slice(0, 200) + '…' : l));
}

function plainLine(c) {
  const show = (v) => (v === undefined || v === '' ? '–' : String(v));
  return 'was' in c ? c.path + ': ' + show(c.was) + ' → ' + show(c.now) : c.path + ': ' + show(c.value);
}
