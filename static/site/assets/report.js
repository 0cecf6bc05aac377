// The report after the drop: a sale's report (GET
// /api/admin/sales/{id}/report) drawn as charts and tables in the operator
// console's report view (/operator?sale=N&view=report). Every chart has a
// text alternative with its figures, and the minutes table holds them all.
import { cumulative, drawLines } from './charts.js';

const STATUSES = ['PENDING', 'PAID', 'EXPIRED', 'CANCELLED', 'REJECTED'];

// timeline merges the room's and the orders' minutes into one list of
// minute starts (Unix ms), in time order.
export function timeline(rep) {
  const set = new Set();
  for (const m of (rep.room && rep.room.minutes) || []) set.add(Date.parse(m.at));
  for (const m of (rep.orders && rep.orders.minutes) || []) set.add(Date.parse(m.at));
  return [...set].filter(Number.isFinite).sort((a, b) => a - b);
}

// minuteRows are the report's minutes on one timeline: the room's counts
// of the minute (0 when it has no row), its waiting shoppers carried
// forward, and the orders placed (live) and paid in it.
export function minuteRows(rep) {
  const times = timeline(rep);
  const room = new Map(((rep.room && rep.room.minutes) || []).map((m) => [Date.parse(m.at), m]));
  const orders = new Map(((rep.orders && rep.orders.minutes) || []).map((m) => [Date.parse(m.at), m]));
  let waiting = 0;
  return times.map((at) => {
    const r = room.get(at);
    const o = orders.get(at);
    if (r) waiting = Number(r.waiting) || 0;
    const wait = r && r.wait && r.wait.count > 0 ? r.wait : null;
    const soldBy = {};
    for (const it of (o && o.items) || []) soldBy[it.itemId] = Number(it.sold) || 0;
    return {
      at,
      joins: r ? Number(r.joins) || 0 : 0,
      admissions: r ? Number(r.admissions) || 0 : 0,
      holds: r ? Number(r.holds) || 0 : 0,
      waiting,
      refusals: r ? sum(r.refusals) : 0,
      shadowed: r ? sum(r.shadowed) : 0,
      p50: wait ? wait.p50Ms : null,
      p90: wait ? wait.p90Ms : null,
      p99: wait ? wait.p99Ms : null,
      sold: o ? Number(o.sold) || 0 : 0,
      paid: o ? Number(o.paid) || 0 : 0,
      soldBy,
    };
  });
}

function sum(counts) {
  return Object.values(counts || {}).reduce((a, n) => a + (Number(n) || 0), 0);
}

// ruleRows are the report's joins refused and shoppers shadowed by rule:
// [rule, refused, shadowed] for every rule with either, the most first.
export function ruleRows(room) {
  const ref = (room && room.refusals) || {};
  const sh = (room && room.shadowed) || {};
  const rules = [...new Set([...Object.keys(ref), ...Object.keys(sh)])];
  const rows = rules.map((rule) => [rule, Number(ref[rule]) || 0, Number(sh[rule]) || 0]);
  return rows.sort((a, b) => b[1] + b[2] - (a[1] + a[2]) || a[0].localeCompare(b[0]));
}

// sellOutLines spreads the report's sell-out curve (orders.sellOut) over
// every step from its first point to its last: per item of items, the
// units sold by the end of each step.
export function sellOutLines(rep, items) {
  const so = (rep.orders && rep.orders.sellOut) || {};
  const pts = so.points || [];
  const step = Number(so.stepMs);
  if (!pts.length || !(step > 0)) return { stepMs: 0, lines: items.map(() => []) };
  const from = Date.parse(pts[0].at);
  const n = Math.round((Date.parse(pts[pts.length - 1].at) - from) / step) + 1;
  const per = new Map(items.map((it) => [it.id, new Array(n).fill(0)]));
  for (const p of pts) {
    const i = Math.round((Date.parse(p.at) - from) / step);
    for (const it of p.items || []) {
      const a = per.get(it.itemId);
      if (a && i >= 0 && i < n) a[i] += Number(it.sold) || 0;
    }
  }
  return { stepMs: step, lines: items.map((it) => cumulative(per.get(it.id))) };
}

// soldOutAfter maps each item sold out (sold ≥ quantity) to the time from
// the opening to its last sale (lastSoldAt), in ms.
export function soldOutAfter(rep) {
  const out = new Map();
  const opens = Date.parse(rep.startsAt);
  const sold = new Map(((rep.orders && rep.orders.items) || []).map((it) => [it.itemId, it]));
  for (const it of rep.items || []) {
    const s = sold.get(it.id);
    if (!s || !s.lastSoldAt || Number(s.sold) < Number(it.quantity)) continue;
    const at = Date.parse(s.lastSoldAt);
    if (Number.isFinite(at) && Number.isFinite(opens)) out.set(it.id, Math.max(0, at - opens));
  }
  return out;
}

// renderReport shows rep in the report section; $ finds an element by id.
export function renderReport(rep, i18n, $) {
  const t = (k, p) => i18n.t(k, p);
  const num = (v) => i18n.number(Number(v));
  const secs = (ms) => (Number.isFinite(Number(ms)) && ms !== null ? i18n.unit(Math.round(Number(ms) / 100) / 10, 'second') : '–');
  const room = rep.room || {};
  const orders = rep.orders || {};
  const wait = room.wait || {};
  const waited = Number(wait.count) > 0;

  $('report-title').textContent = t('op.report.titleOf', { id: rep.saleId, name: rep.name || '' });
  const status = $('report-status');
  status.dataset.final = String(!!rep.final);
  status.textContent = t(rep.final ? 'op.report.final' : 'op.report.live', { time: i18n.time(Date.parse(rep.generatedAt)) });

  const facts = {
    'rep-joined': num(room.joined),
    'rep-prequeue': Number(room.preQueue) >= 0 ? num(room.preQueue) : t('op.report.notDrawn'),
    'rep-admitted': num(room.admitted),
    'rep-holds': num(room.holds),
    'rep-waiting': num(room.waiting),
    'rep-p50': waited ? secs(wait.p50Ms) : '–',
    'rep-p90': waited ? secs(wait.p90Ms) : '–',
    'rep-p99': waited ? secs(wait.p99Ms) : '–',
    'rep-sold': num(orders.sold),
    'rep-placed': num(orders.placed),
    'rep-paid': num(orders.paid),
    'rep-conversion': new Intl.NumberFormat(i18n.lang, { style: 'percent', maximumFractionDigits: 1 }).format(Number(orders.paymentConversion) || 0),
  };
  for (const [id, v] of Object.entries(facts)) $(id).textContent = v;

  // Charts: one point per minute of the timeline.
  const rows = minuteRows(rep);
  const charts = $('report-charts');
  const col = (k) => rows.map((r) => r[k]);
  const peak = (values) => Math.max(0, ...values.filter(Number.isFinite));
  const name = (k) => t(k);
  const aria = (k, figures) => t('op.report.chartAria', { name: name(k), minutes: rows.length, figures });

  const joins = col('joins');
  drawLines(charts, 'joins', name('op.report.chart.joins'), [{ label: t('op.report.line.joins'), values: joins }],
    t('op.report.joinedPre', { joined: num(room.joined), prequeue: facts['rep-prequeue'] }),
    aria('op.report.chart.joins', t('op.report.aria.joins', { joined: num(room.joined), prequeue: facts['rep-prequeue'], peak: num(peak(joins)) })));

  const adm = col('admissions'), holds = col('holds');
  drawLines(charts, 'admissions', name('op.report.chart.admissions'),
    [{ label: t('op.report.line.admissions'), values: adm }, { label: t('op.report.line.holds'), values: holds }],
    num(room.admitted),
    aria('op.report.chart.admissions', t('op.report.aria.admissions', { admitted: num(room.admitted), holds: num(room.holds), peak: num(peak(adm)) })));

  // The sell-out curve at its own fine step (a drop sells out in about a
  // second: a minute would show one step), and when each item sold out.
  const itemName = (it) => it.name || t('items.product', { id: it.productId });
  const items = rep.items || [];
  const curve = sellOutLines(rep, items);
  const soldLines = items.map((it, i) => ({ label: '#' + it.id + ' ' + itemName(it), values: curve.lines[i] }));
  const soldOf = new Map((orders.items || []).map((it) => [it.itemId, it]));
  const soldOutIn = soldOutAfter(rep);
  const soldText = items.map((it) => {
    const sold = (soldOf.get(it.id) || {}).sold || 0;
    const text = t('op.report.aria.itemSold', { item: '#' + it.id + ' ' + itemName(it), sold: num(sold), quantity: num(it.quantity) });
    return soldOutIn.has(it.id) ? text + ' (' + t('op.report.soldOutAfter', { time: secs(soldOutIn.get(it.id)) }) + ')' : text;
  }).join('; ');
  const all = items.length > 0 && items.every((it) => soldOutIn.has(it.id));
  drawLines(charts, 'sold', name('op.report.chart.sold'), soldLines,
    all ? t('op.report.soldOutAfter', { time: secs(Math.max(...items.map((it) => soldOutIn.get(it.id)))) }) : num(orders.sold),
    aria('op.report.chart.sold', soldText + (curve.stepMs ? ' · ' + t('op.report.aria.step', { step: secs(curve.stepMs) }) : '')));

  const ms = (k) => rows.map((r) => (r[k] === null ? NaN : r[k]));
  drawLines(charts, 'wait', name('op.report.chart.wait'),
    [{ label: 'p50', values: ms('p50') }, { label: 'p90', values: ms('p90') }, { label: 'p99', values: ms('p99') }],
    waited ? secs(wait.p99Ms) : '–',
    aria('op.report.chart.wait', waited
      ? t('op.report.aria.wait', { count: num(wait.count), p50: secs(wait.p50Ms), p90: secs(wait.p90Ms), p99: secs(wait.p99Ms) })
      : t('op.report.noWaits')));

  // Refusals and shadowing by rule.
  const refRows = ruleRows(room).map(([rule, refused, shadowed]) =>
    row([i18n.has('op.report.rule.' + rule) ? t('op.report.rule.' + rule) : rule, num(refused), num(shadowed)]));
  if (!refRows.length) refRows.push(row([t('op.report.noRefusals'), '–', '–']));
  $('report-refusals').replaceChildren(...refRows);

  // Orders by status, then the conversion.
  const by = orders.byStatus || {};
  const stRows = STATUSES.map((st) => row([t('orderStatus.' + st), num(by[st] || 0)]));
  stRows.push(row([t('op.report.conversion'), facts['rep-conversion']]));
  $('report-statuses').replaceChildren(...stRows);

  // Every minute's figures.
  $('report-minutes').replaceChildren(
    ...rows.map((r) => row([i18n.time(r.at), num(r.joins), num(r.admissions), num(r.holds), num(r.waiting), num(r.refusals), num(r.shadowed),
      secs(r.p50), secs(r.p90), secs(r.p99), num(r.sold), num(r.paid)])),
  );
  $('report-minutes-empty').hidden = rows.length > 0;
}

// row builds a table row: the first cell a row header.
function row(cells) {
  const tr = document.createElement('tr');
  cells.forEach((c, i) => {
    const cell = document.createElement(i === 0 ? 'th' : 'td');
    if (i === 0) cell.scope = 'row';
    cell.textContent = c;
    tr.append(cell);
  });
  return tr;
}
