// Operator console: sales, live figures, the kill switch, bot-defense
// knobs, audit log. Every write of a sale or of the settings sends If-Match
// with the version the console showed; a 412 VERSION_CONFLICT shows what
// another operator changed and offers a reload, never overwrites.
import { request } from './api.js';
import { acquireToken, clearToken, decodeClaims, looksLikeJWT, saveToken } from './auth.js';
import { Series, drawChart, getPath, pivotCounters, ratePerSecond, setPath, shadowPaths } from './charts.js';
import { setupLanguage } from './lang.js';
import { changeLines, conflictChanges } from './conflict.js';
import { renderReport } from './report.js';
import { renderShadowKnobs, renderShadowed, ruleName as shadowRuleName } from './shadowq.js';

const TOKEN_KEY = 'flashsale.operatorToken';
const ADMIN = '/api/admin';
const HISTORY = 300; // points: five minutes at one poll a second
// The report view reads again this often until the sale has ended; the
// gateways write the room's figures every 5 s.
const REPORT_EVERY = 5000;

// The bot-defense rules (defense/settings.go), for shadow mode.
const SHADOW_RULES = ['blocklist', 'perIp', 'perPrefix', 'perUser', 'pow'];

const $ = (id) => document.getElementById(id);

let i18n = null;
const t = (key, params) => i18n.t(key, params);

const op = {
  token: '',
  saleId: '',
  sales: [],
  sale: null, // the admin sale as last read
  pinned: null, // the admin sale as it was when the operator began an edit
  settings: null,
  series: new Map(), // key → Series
  lastAdmitted: null, // {t, v}
  lastDefense: null, // {t, totals: {outcome: n}}
  timers: [],
  figuresInFlight: false,
  error: null,
  change: null, // {key, params, audit}
  createResult: null,
  conflict: null, // {kind: 'sale' | 'settings', mine, current}
  view: '', // 'report': the report after the drop of op.saleId alone
  report: null, // the report as last read
  reportInFlight: false,
};

function series(key) {
  if (!op.series.has(key)) op.series.set(key, new Series(HISTORY));
  return op.series.get(key);
}

// ---------- errors, sign-in ----------

function showError(code, message) {
  op.error = code ? { code, message } : null;
  renderError();
}

function renderError() {
  const el = $('error');
  if (!op.error) {
    el.textContent = '';
    el.removeAttribute('data-error');
    return;
  }
  const { code, message } = op.error;
  el.dataset.error = code;
  el.textContent = i18n.has('op.error.' + code) ? t('op.error.' + code) : message ? code + ': ' + message : t('op.error.generic', { code });
}

// refusal is the words for a refused write: the catalogue's for its code,
// else the server's message (English, safe to show) after the code.
function refusal(r) {
  const code = r.error || 'HTTP_' + r.status;
  // The server's message names the field at fault; the catalogue's words
  // frame it.
  if (i18n.has('op.refused.' + code)) return t('op.refused.' + code, { message: r.message || code });
  return r.message ? code + ': ' + r.message : code;
}

// api calls the admin API and handles sign-in failures in one place.
async function api(method, path, body, headers) {
  const r = await request(method, ADMIN + path, { token: op.token, body, headers });
  if (r.status === 401) {
    signOut();
    showError('UNAUTHENTICATED');
  } else if (r.status === 403) {
    showError('FORBIDDEN');
  }
  return r;
}

function renderSigned() {
  if (!op.token) {
    $('op-signed').textContent = '';
    return;
  }
  const claims = decodeClaims(op.token);
  $('op-signed').textContent = claims && claims.sub ? t('op.signedAs', { user: claims.sub }) : t('signin.signedIn');
}

function signIn(token) {
  op.token = token;
  saveToken(TOKEN_KEY, token);
  renderSigned();
  $('op-signin').hidden = true;
  $('op-signout').hidden = false;
  $('console').hidden = false;
  showError('');
  startPolling();
}

function signOut() {
  op.token = '';
  clearToken(TOKEN_KEY);
  for (const tm of op.timers) clearInterval(tm);
  op.timers = [];
  renderSigned();
  $('op-signin').hidden = false;
  $('op-signout').hidden = true;
  $('console').hidden = true;
}

// ---------- versions ----------

// versionOf is the version an admin answer carries (the body's field, else
// the ETag).
function versionOf(r) {
  if (r.body && Number.isFinite(Number(r.body.version)) && r.body.version !== undefined) return Number(r.body.version);
  const m = /^(?:W\/)?"?(\d+)"?$/.exec(r.etag || '');
  return m ? Number(m[1]) : NaN;
}

function ifMatch(version) {
  return Number.isFinite(version) ? { 'If-Match': '"' + version + '"' } : {};
}

// saleVersion is the version a sale write sends: the one shown when the
// operator began editing (a form the operator has typed in keeps it), else
// the one shown now.
function saleVersion() {
  const s = op.pinned || op.sale;
  return s ? Number(s.version) : NaN;
}

function pinSale() {
  if (!op.pinned && op.sale) op.pinned = op.sale;
}

function stateLabel(state) {
  return i18n.has('state.' + state) ? t('state.' + state) : state || '';
}

// ---------- sales ----------

async function loadSales() {
  const r = await api('GET', '/sales');
  if (!r.ok) return;
  op.sales = Array.isArray(r.body) ? r.body : (r.body && r.body.sales) || [];
  renderSales();
}

function renderSales() {
  const ul = $('sales-list');
  ul.replaceChildren();
  for (const s of op.sales) {
    const li = document.createElement('li');
    li.id = 'op-sale-' + s.id;
    const btn = document.createElement('button');
    btn.type = 'button';
    btn.className = 'link' + (String(s.id) === op.saleId ? ' selected' : '');
    btn.textContent = '#' + s.id + ' ' + (s.name || '');
    btn.setAttribute('aria-pressed', String(String(s.id) === op.saleId));
    btn.addEventListener('click', () => selectSale(String(s.id)));
    const meta = document.createElement('span');
    meta.className = 'muted small';
    const starts = Date.parse(s.startsAt);
    meta.textContent = ' ' + t('op.sales.meta', { state: stateLabel(s.state), starts: i18n.dateTime(starts), rate: s.admissionRatePerSecond ?? '?' });
    li.append(btn, meta);
    ul.append(li);
  }
  if (!op.sales.length) {
    const li = document.createElement('li');
    li.className = 'muted';
    li.textContent = t('op.sales.none');
    ul.append(li);
  }
}

function selectSale(id) {
  if (op.saleId !== id) {
    op.series.clear();
    op.lastAdmitted = null;
    op.sale = null;
    op.pinned = null;
    $('charts').replaceChildren();
    $('fig-items').replaceChildren();
    $('stock-item').replaceChildren();
    $('rate-input').value = '';
    $('message-text').value = '';
  }
  op.saleId = id;
  $('report-link').href = '/operator?sale=' + encodeURIComponent(id) + '&view=report';
  $('figures-empty').hidden = true;
  $('figures-body').hidden = false;
  loadSales();
  loadFigures();
}

// The create form: one group per item ("Item 1"), each with product,
// quantity, price, currency, name and image. Each label sits above its own
// input in one field box, so that a wrapping row never leaves a label
// beside the next field's input.
const ITEM_FIELDS = [
  { name: 'productId', label: 'op.item.product', type: 'number', min: 1, size: 7, required: true },
  { name: 'quantity', label: 'op.item.quantity', type: 'number', min: 1, size: 7, required: true },
  { name: 'priceCents', label: 'op.item.price', type: 'number', min: 0, size: 7, required: true },
  { name: 'currency', label: 'op.item.currency', type: 'text', size: 4, pattern: '[A-Z]{3}', maxLength: 3 },
  { name: 'name', label: 'op.item.name', type: 'text', size: 18, maxLength: 200 },
  { name: 'imageUrl', label: 'op.item.image', type: 'text', size: 24, maxLength: 2048 },
];

function addItemRow(values = {}) {
  const n = $('cs-items').children.length + 1;
  const row = document.createElement('fieldset');
  row.className = 'item-row';
  row.dataset.n = String(n);
  const legend = document.createElement('legend');
  legend.textContent = t('op.item.legend', { n });
  const fields = document.createElement('div');
  fields.className = 'row end';
  row.append(legend, fields);
  for (const f of ITEM_FIELDS) {
    const id = 'cs-' + f.name + '-' + n;
    const l = document.createElement('label');
    l.htmlFor = id;
    l.dataset.i18n = f.label;
    l.textContent = t(f.label);
    const i = document.createElement('input');
    i.id = id;
    i.name = f.name;
    i.type = f.type;
    if (f.type === 'number') {
      i.min = String(f.min);
      i.step = '1';
    }
    if (f.pattern) i.pattern = f.pattern;
    if (f.maxLength) i.maxLength = f.maxLength;
    i.size = f.size;
    i.required = !!f.required;
    i.value = values[f.name] === undefined ? '' : String(values[f.name]);
    const field = document.createElement('div');
    field.className = 'field';
    field.append(l, i);
    fields.append(field);
  }
  if (n > 1) {
    const rm = document.createElement('button');
    rm.type = 'button';
    rm.className = 'secondary';
    rm.dataset.i18n = 'op.item.remove';
    rm.textContent = t('op.item.remove');
    rm.dataset.removeN = String(n);
    rm.setAttribute('aria-label', t('op.item.removeLabel', { n }));
    rm.addEventListener('click', () => row.remove());
    fields.append(rm);
  }
  $('cs-items').append(row);
}

function localInputValue(ms) {
  const d = new Date(ms);
  const p = (x) => String(x).padStart(2, '0');
  return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + 'T' + p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
}

function setCreateResult(key, params) {
  op.createResult = key ? { key, params } : null;
  $('create-result').textContent = key ? t(key, params) : '';
}

async function createSale(ev) {
  ev.preventDefault();
  const starts = new Date($('cs-starts').value);
  if (Number.isNaN(starts.getTime())) {
    setCreateResult('op.create.needStart');
    return;
  }
  const items = [...$('cs-items').children].map((row) => {
    const v = (name) => row.querySelector('[name=' + name + ']').value.trim();
    const it = { productId: Number(v('productId')), quantity: Number(v('quantity')), priceCents: Number(v('priceCents')) };
    // Empty optional fields are left out: the server's defaults apply.
    if (v('currency')) it.currency = v('currency').toUpperCase();
    if (v('name')) it.name = v('name');
    if (v('imageUrl')) it.imageUrl = v('imageUrl');
    return it;
  });
  const access = accessBody('cs-access', 'cs-members', 'cs-public', 'cs-draw');
  if (!access) {
    setCreateResult('op.create.failed', { why: t('acc.badTime') });
    return;
  }
  const body = {
    name: $('cs-name').value.trim(),
    startsAt: starts.toISOString(),
    admissionRatePerSecond: Number($('cs-rate').value),
    allocation: $('cs-allocation').value,
    claimWindowSeconds: Number($('cs-window').value),
    access,
    items,
  };
  $('cs-submit').disabled = true;
  const r = await api('POST', '/sales', body);
  $('cs-submit').disabled = false;
  if (r.status === 201 || r.ok) {
    setCreateResult('op.create.created', { id: r.body.id, state: stateLabel(r.body.state) });
    await loadSales();
    selectSale(String(r.body.id));
    showChange('op.change.created', { id: r.body.id });
  } else {
    setCreateResult('op.create.failed', { why: refusal(r) });
  }
}

// ---------- live figures ----------

function itemFigures(it) {
  const f = it.figures && typeof it.figures === 'object' ? { ...it, ...it.figures } : it;
  return {
    id: String(f.id ?? f.itemId), productId: f.productId, name: f.name, currency: f.currency, imageUrl: f.imageUrl, quantity: f.quantity, priceCents: f.priceCents,
    remaining: f.remaining, sold: f.sold, paid: f.paid, expired: f.expired, cancelled: f.cancelled, rejected: f.rejected,
  };
}

function itemLabel(it) {
  const name = it.name || t('items.product', { id: it.productId });
  return '#' + it.id + ' ' + name + (Number.isFinite(Number(it.priceCents)) ? ' (' + i18n.price(Number(it.priceCents), it.currency || 'USD') + ')' : '');
}

async function loadFigures() {
  if (!op.saleId || op.figuresInFlight) return;
  op.figuresInFlight = true;
  const id = op.saleId;
  const r = await api('GET', '/sales/' + encodeURIComponent(id));
  op.figuresInFlight = false;
  if (id !== op.saleId) return;
  if (!r.ok) {
    if (r.networkError) showError('NETWORK');
    return;
  }
  if (!Number.isFinite(Number(r.body.version))) {
    const v = versionOf(r);
    if (Number.isFinite(v)) r.body.version = v;
  }
  op.sale = r.body;
  renderFigures(true);
  loadShadowed(id);
}

// loadShadowed reads the sale's shadow queue (every other figures poll)
// and shows it.
async function loadShadowed(id, force = false) {
  op.shadowTick = (op.shadowTick || 0) + 1;
  if (!force && op.shadowTick % 2 !== 1) return;
  const r = await api('GET', '/sales/' + encodeURIComponent(id) + '/shadow?limit=50');
  if (id !== op.saleId || !r.ok) return;
  op.shadowQ = { id, body: r.body };
  renderShadowQ();
}

// renderShadowQ shows the sale's shadow queue as last read.
function renderShadowQ() {
  const q = op.shadowQ;
  if (!q || q.id !== op.saleId) return;
  const id = q.id;
  renderShadowed(q.body, $('shadowq-list'), $('shadowq-summary'), {
    t, num, time: (ms) => i18n.time(ms),
    onRelease: async (user) => {
      const rr = await api('POST', '/sales/' + encodeURIComponent(id) + '/shadow/' + encodeURIComponent(user) + '/release');
      if (rr.ok) {
        await showChange('op.change.released', { user: String(user) }, false);
      } else {
        showChange('op.change.refused', { why: refusal(rr) }, false);
      }
      loadShadowed(id, true);
    },
  });
}

function renderFigures(sample) {
  const s = op.sale;
  if (!s) return;
  const now = Date.now();
  const q = s.queue || {};
  $('figures-title').textContent = t('op.fig.titleOf', { id: s.id, name: s.name || '' });
  const st = $('fig-state');
  st.textContent = stateLabel(s.state);
  st.dataset.state = s.state || '';
  $('fig-version').textContent = num(s.version);
  $('fig-joined').textContent = num(q.joined);
  $('fig-waiting').textContent = num(q.waiting);
  $('fig-admitted').textContent = num(q.admitted);
  renderAccess();
  $('fig-rate-setting').textContent = t('op.fig.perSecond', { n: num(s.admissionRatePerSecond) });
  if (document.activeElement !== $('rate-input') && $('rate-input').value === '') $('rate-input').value = s.admissionRatePerSecond ?? '';
  $('ctl-pause').disabled = s.state === 'PAUSED' || s.state === 'ENDED';
  $('ctl-resume').disabled = s.state !== 'PAUSED';
  $('ctl-end').disabled = s.state === 'ENDED';

  let rate = null;
  if (sample) {
    const cur = { t: now, v: Number(q.admitted) };
    rate = ratePerSecond(op.lastAdmitted, cur);
    if (Number.isFinite(cur.v)) op.lastAdmitted = cur;
    $('fig-admit-rate').textContent = rate === null ? '–' : i18n.number(Math.round(rate * 10) / 10);
    if (rate !== null) series('admitRate').push(now, rate);
    series('waiting').push(now, Number(q.waiting));
  }

  const tbody = $('fig-items');
  let remaining = 0, sold = 0, paid = 0;
  const rows = [];
  const items = (s.items || []).map(itemFigures);
  for (const it of items) {
    remaining += Number(it.remaining) || 0;
    sold += Number(it.sold) || 0;
    paid += Number(it.paid) || 0;
    const tr = document.createElement('tr');
    tr.id = 'fig-item-' + it.id;
    const cells = [itemLabel(it), num(it.quantity), num(it.remaining), num(it.sold), num(it.paid), num(it.expired), num(it.cancelled), num(it.rejected)];
    cells.forEach((c, i) => {
      const cell = document.createElement(i === 0 ? 'th' : 'td');
      if (i === 0) cell.scope = 'row';
      cell.textContent = c;
      tr.append(cell);
    });
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
  renderStockItems(items);
  if (sample) {
    series('remaining').push(now, remaining);
    series('sold').push(now, sold);
    series('paid').push(now, paid);
  }
  const last = (k) => {
    const v = series(k).values();
    return v.length ? v[v.length - 1] : NaN;
  };
  const charts = $('charts');
  const draw = (key, label, latest) => drawChart(charts, key, t(label), series(key).values(), latest, t('op.chart.aria', { name: t(label) }));
  const rateNow = last('admitRate');
  draw('admitRate', 'op.chart.admitRate', Number.isFinite(rateNow) ? i18n.number(Math.round(rateNow * 10) / 10) : '–');
  draw('waiting', 'op.chart.waiting', num(q.waiting));
  draw('remaining', 'op.chart.remaining', i18n.number(remaining));
  draw('sold', 'op.chart.sold', i18n.number(sold));
  draw('paid', 'op.chart.paid', i18n.number(paid));
  if (!op.pinned && document.activeElement !== $('message-text') && $('message-text').value === '' && s.message && s.message.text) {
    $('message-text').value = s.message.text;
  }
}

function renderStockItems(items) {
  const sel = $('stock-item');
  const want = items.map((it) => it.id).join(',');
  const label = (it) => itemLabel(it);
  if (sel.dataset.items === want) {
    for (const o of sel.options) {
      const it = items.find((x) => x.id === o.value);
      if (it) o.textContent = label(it);
    }
    return;
  }
  const keep = sel.value;
  sel.replaceChildren(
    ...items.map((it) => {
      const o = document.createElement('option');
      o.value = it.id;
      o.textContent = label(it);
      return o;
    }),
  );
  if (items.some((it) => it.id === keep)) sel.value = keep;
  sel.dataset.items = want;
}

function num(v) {
  if (v === undefined || v === null || v === '') return '–';
  const n = Number(v);
  return Number.isFinite(n) ? i18n.number(n) : String(v);
}

// saleWrite sends one write of the chosen sale with If-Match, then shows
// the result: the new sale, or the conflict with the current one.
async function saleWrite(method, path, body, key, params, audited = true) {
  if (!op.saleId) return false;
  const mine = op.pinned || op.sale;
  const r = await api(method, '/sales/' + encodeURIComponent(op.saleId) + path, body, ifMatch(saleVersion()));
  if (r.ok) {
    op.pinned = null;
    if (r.body && typeof r.body === 'object' && r.body.id !== undefined) {
      if (!Number.isFinite(Number(r.body.version))) r.body.version = versionOf(r);
      op.sale = r.body;
      renderFigures(false);
    }
    await showChange(key, params, audited);
    loadFigures();
    return true;
  }
  if (r.status === 412 && r.error === 'VERSION_CONFLICT') {
    showConflict('sale', mine, r.body && r.body.current);
    return false;
  }
  showChange('op.change.refused', { why: refusal(r) }, false);
  loadFigures();
  return false;
}

async function applyRate(ev) {
  ev.preventDefault();
  if (!op.saleId) return;
  const n = Number($('rate-input').value);
  if (!Number.isInteger(n) || n < 1) {
    showChange('op.change.badRate', {}, false);
    return;
  }
  // A PATCH is not an audited action: its report names no audit entry,
  // which would be an unrelated one.
  await saleWrite('PATCH', '', { admissionRatePerSecond: n }, 'op.change.rate', { n }, false);
}

function wireControls() {
  $('rate-form').addEventListener('submit', applyRate);
  for (const id of ['rate-input', 'message-text', 'stock-add']) $(id).addEventListener('input', pinSale);
  $('ctl-pause').addEventListener('click', () => saleWrite('POST', '/pause', undefined, 'op.change.paused'));
  $('ctl-resume').addEventListener('click', () => saleWrite('POST', '/resume', undefined, 'op.change.resumed'));
  $('ctl-end').addEventListener('click', () => {
    // Ending cannot be undone: it asks first, with what it does.
    pinSale();
    $('end-confirm').hidden = false;
    $('ctl-end-no').focus();
  });
  $('ctl-end-no').addEventListener('click', () => {
    $('end-confirm').hidden = true;
    op.pinned = null;
    $('ctl-end').focus();
  });
  $('ctl-end-yes').addEventListener('click', async () => {
    $('end-confirm').hidden = true;
    await saleWrite('POST', '/end', undefined, 'op.change.ended');
  });
  $('stock-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const item = $('stock-item').value;
    const n = Number($('stock-add').value);
    if (!item) return;
    if (!Number.isInteger(n) || n < 1 || n > 1000000) {
      showChange('op.change.badStock', {}, false);
      return;
    }
    if (await saleWrite('POST', '/items/' + encodeURIComponent(item) + '/stock', { add: n }, 'op.change.stock', { n, item })) $('stock-add').value = '';
  });
  $('message-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const text = $('message-text').value.trim();
    if (text.length > 280) {
      showChange('op.change.longMessage', {}, false);
      return;
    }
    await saleWrite('POST', '/message', { text }, text ? 'op.change.message' : 'op.change.messageCleared');
  });
  $('message-clear').addEventListener('click', async () => {
    pinSale();
    if (await saleWrite('POST', '/message', { text: '' }, 'op.change.messageCleared')) $('message-text').value = '';
  });
  $('conflict-reload').addEventListener('click', reloadAfterConflict);
  $('conflict-dismiss').addEventListener('click', () => {
    op.conflict = null;
    $('conflict').hidden = true;
  });
}

// ---------- conflicts ----------

function showConflict(kind, mine, current) {
  op.conflict = { kind, mine: mine || {}, current: current || {} };
  renderConflict();
  $('conflict').hidden = false;
  $('conflict-reload').focus();
}

function renderConflict() {
  const c = op.conflict;
  if (!c) return;
  const box = $('conflict');
  box.dataset.kind = c.kind;
  const ver = (x) => (x && x.version !== undefined ? x.version : '?');
  $('conflict-text').textContent = t(c.kind === 'sale' ? 'conflict.sale' : 'conflict.settings', { mine: ver(c.mine), now: ver(c.current) });
  const ul = $('conflict-changes');
  ul.replaceChildren();
  const changes = conflictChanges(c.mine, c.current);
  for (const ch of changes.slice(0, 30)) {
    const li = document.createElement('li');
    li.dataset.path = ch.path;
    li.textContent = t('conflict.change', { field: fieldLabel(ch.path), was: shown(ch.path, ch.was), now: shown(ch.path, ch.now) });
    ul.append(li);
  }
  if (!changes.length) {
    const li = document.createElement('li');
    li.textContent = t('conflict.noDiff');
    ul.append(li);
  }
}

function fieldLabel(path) {
  const key = 'field.' + path.replace(/\.\d+\./g, '.*.').replace(/^items\.\*\./, 'items.');
  // shadow.<rule>: the rule's own name.
  if (path.startsWith('shadow.')) return t('field.shadow', { rule: ruleLabel(path.slice('shadow.'.length)) });
  if (path.startsWith('shadowQueue.rules.')) return t('field.shadowQueue', { rule: shadowRuleName(path.slice('shadowQueue.rules.'.length), t) });
  if (i18n.has(key)) {
    const m = /^items\.(\d+)\./.exec(path);
    return m ? t('field.itemN', { n: Number(m[1]) + 1, field: t(key) }) : t(key);
  }
  return path;
}

function shown(path, v) {
  if (v === undefined || v === '') return t('conflict.none');
  if (/(^|\.)state$/.test(path)) return stateLabel(String(v));
  if (typeof v === 'number') return i18n.number(v);
  if (typeof v === 'boolean') return t(v ? 'common.yes' : 'common.no');
  if (/At$/.test(path) && typeof v === 'string' && Number.isFinite(Date.parse(v))) return i18n.dateTime(Date.parse(v));
  return String(v);
}

async function reloadAfterConflict() {
  const c = op.conflict;
  op.conflict = null;
  $('conflict').hidden = true;
  op.pinned = null;
  if (c && c.kind === 'settings') {
    await loadSettings(true);
  } else {
    $('message-text').value = '';
    $('rate-input').value = '';
    await loadFigures();
  }
  showChange('op.change.reloaded', {}, false);
}

// ---------- defense counters ----------

async function loadDefense() {
  const r = await api('GET', '/defense');
  if (!r.ok || !r.body) return;
  op.defense = r.body;
  renderDefense(true);
}

function outcomeLabel(o) {
  return i18n.has('outcome.' + o) ? t('outcome.' + o) : o;
}

function ruleLabel(rule) {
  return i18n.has('rule.' + rule) ? t('rule.' + rule) : rule;
}

function renderDefense(sample) {
  if (!op.defense) return;
  const { outcomes, rows } = pivotCounters(op.defense);
  const table = $('defense-table');
  const head = document.createElement('thead');
  const hr = document.createElement('tr');
  for (const [i, h] of [t('def.rule'), ...outcomes.map(outcomeLabel)].entries()) {
    const th = document.createElement('th');
    th.scope = 'col';
    if (i > 0) th.dataset.outcome = outcomes[i - 1];
    th.textContent = h;
    hr.append(th);
  }
  head.append(hr);
  const body = document.createElement('tbody');
  const totals = {};
  for (const row of rows) {
    const tr = document.createElement('tr');
    tr.dataset.rule = row.rule;
    const th = document.createElement('th');
    th.scope = 'row';
    th.textContent = ruleLabel(row.rule);
    tr.append(th);
    for (const o of outcomes) {
      const td = document.createElement('td');
      td.dataset.outcome = o;
      td.textContent = num(row.values[o]);
      tr.append(td);
      totals[o] = (totals[o] || 0) + (row.values[o] || 0);
    }
    body.append(tr);
  }
  table.replaceChildren(head, body);

  const now = Date.now();
  const charts = $('defense-charts');
  for (const o of outcomes) {
    let latest = '–';
    if (sample) {
      const rate = op.lastDefense ? ratePerSecond({ t: op.lastDefense.t, v: op.lastDefense.totals[o] ?? 0 }, { t: now, v: totals[o] }) : null;
      if (rate !== null) series('def-' + o).push(now, rate);
    }
    const v = series('def-' + o).values();
    if (v.length) latest = i18n.number(Math.round(v[v.length - 1] * 10) / 10);
    const title = t('def.perSecond', { outcome: outcomeLabel(o) });
    drawChart(charts, 'def-' + o, title, v, latest, t('op.chart.aria', { name: title }));
  }
  if (sample) op.lastDefense = { t: now, totals };
}

// ---------- settings ----------

// loadSettings reads the settings; the forms show them and later writes
// send their version. force replaces a document the operator is editing.
async function loadSettings(force = false) {
  const r = await api('GET', '/settings');
  if (!r.ok || !r.body) return null;
  if (!Number.isFinite(Number(r.body.version))) {
    const v = versionOf(r);
    if (Number.isFinite(v)) r.body.version = v;
  }
  op.settings = r.body;
  if (force) $('settings-json').blur();
  renderSettings(force);
  return r.body;
}

function setIfIdle(id, v) {
  const el = $(id);
  if (document.activeElement !== el) el.value = v === undefined || v === null ? '' : String(v);
}

function renderSettings(forceDoc = false) {
  const s = op.settings || {};
  setIfIdle('rl-ip-rps', getPath(s, ['rateLimit', 'perIp', 'rps']));
  setIfIdle('rl-ip-burst', getPath(s, ['rateLimit', 'perIp', 'burst']));
  setIfIdle('rl-user-rps', getPath(s, ['rateLimit', 'perUser', 'rps']));
  setIfIdle('rl-user-burst', getPath(s, ['rateLimit', 'perUser', 'burst']));
  setIfIdle('pow-difficulty', getPath(s, ['pow', 'difficulty']));
  renderChips('block-users', getPath(s, ['blocklist', 'users']) || [], 'users', 'knobs.unblockUser');
  renderChips('block-cidrs', getPath(s, ['blocklist', 'cidrs']) || [], 'cidrs', 'knobs.unblockCidr');
  setIfIdle('pow-solve-seconds', getPath(s, ['pow', 'solveSeconds']));
  $('preset-name').textContent = s.preset ? (i18n.has('preset.' + s.preset) ? t('preset.' + s.preset) : s.preset) : '–';
  $('settings-version').textContent = num(s.version);
  const box = $('shadow-list');
  box.replaceChildren();
  // defense/settings.go: "shadow" maps a rule name to true; other paths
  // named shadow are shown too, in case the document grows some.
  const paths = SHADOW_RULES.map((r) => ['shadow', r]);
  for (const r of Object.keys((s.shadow && typeof s.shadow === 'object' && s.shadow) || {})) if (!SHADOW_RULES.includes(r)) paths.push(['shadow', r]);
  for (const p of shadowPaths(s)) if (!paths.some((q) => q.join('.') === p.join('.'))) paths.push(p);
  for (const path of paths) {
    const id = 'shadow-' + path.join('-');
    const row = document.createElement('div');
    row.className = 'check';
    const cb = document.createElement('input');
    cb.type = 'checkbox';
    cb.id = id;
    cb.checked = getPath(s, path) === true;
    const rule = path.slice(1).join('.');
    cb.addEventListener('change', () =>
      changeSettings((doc) => {
        setPath(doc, path, cb.checked);
        if (path[0] === 'shadow' && !cb.checked) delete doc.shadow[path[1]];
      }, cb.checked ? 'op.change.shadowOn' : 'op.change.shadowOff', { rule: ruleLabel(rule) }),
    );
    const l = document.createElement('label');
    l.htmlFor = id;
    l.textContent = ' ' + ruleLabel(path[path.length - 1]);
    row.append(cb, l);
    box.append(row);
  }
  renderShadowKnobs(s, $('shadowq-rules'), $('shadowq-risk'), {
    t,
    idle: (el) => document.activeElement !== el,
    onRule: (rule, on) =>
      changeSettings((doc) => {
        setPath(doc, ['shadowQueue', 'rules', rule], on);
        if (!on) delete doc.shadowQueue.rules[rule];
      }, on ? 'op.change.sqOn' : 'op.change.sqOff', { rule: shadowRuleName(rule, t) }),
    onRisk: (v) => {
      if (!(v >= 0 && v < 1)) {
        showChange('op.change.badRisk', {}, false);
        return;
      }
      changeSettings((doc) => {
        setPath(doc, ['shadowQueue', 'riskAbove'], v);
        if (v === 0) delete doc.shadowQueue.riskAbove;
      }, 'op.change.sqRisk', { v: i18n.number(v) });
    },
  });
  if (forceDoc || document.activeElement !== $('settings-json')) {
    $('settings-json').value = JSON.stringify(s, null, 2);
    op.settingsDocVersion = Number(s.version);
  }
}

function renderChips(listId, values, field, labelKey) {
  const ul = $(listId);
  ul.replaceChildren();
  for (const v of values) {
    const li = document.createElement('li');
    li.append(String(v));
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'secondary';
    b.textContent = '×';
    b.setAttribute('aria-label', t(labelKey, { v }));
    b.addEventListener('click', () =>
      changeSettings((doc) => {
        const list = getPath(doc, ['blocklist', field]) || [];
        setPath(doc, ['blocklist', field], list.filter((x) => String(x) !== String(v)));
      }, labelKey === 'knobs.unblockUser' ? 'op.change.unblockedUser' : 'op.change.unblockedCidr', { v }),
    );
    li.append(b);
    ul.append(li);
  }
}

// putSettings writes a whole document with If-Match: the version the
// console read it at.
async function putSettings(doc, version, key, params) {
  const mine = op.settings;
  const body = structuredClone(doc);
  delete body.version;
  const r = await api('PUT', '/settings', body, ifMatch(version));
  if (r.ok) {
    const next = r.body && typeof r.body === 'object' ? r.body : doc;
    if (!Number.isFinite(Number(next.version))) {
      const v = versionOf(r);
      if (Number.isFinite(v)) next.version = v;
    }
    op.settings = next;
    $('settings-json').blur();
    renderSettings(true);
    await showChange(key, params);
    return true;
  }
  if (r.status === 412 && r.error === 'VERSION_CONFLICT') {
    showConflict('settings', mine, r.body && r.body.current);
    return false;
  }
  showChange('op.change.refused', { why: refusal(r) }, false);
  return false;
}

// changeSettings edits the document as the console last read it and
// writes it whole (fields this page does not know survive), with the
// version it was read at.
async function changeSettings(edit, key, params) {
  const current = op.settings || (await loadSettings());
  if (!current) {
    showChange('op.change.cannotRead', {}, false);
    return;
  }
  const doc = structuredClone(current);
  edit(doc);
  await putSettings(doc, Number(current.version), key, params);
}

function numberOrKeep(id, old) {
  const raw = $(id).value.trim();
  if (raw === '') return old;
  const n = Number(raw);
  return Number.isFinite(n) ? n : old;
}

function wireSettings() {
  $('rl-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    changeSettings((doc) => {
      const p = ['rateLimit'];
      setPath(doc, [...p, 'perIp', 'rps'], numberOrKeep('rl-ip-rps', getPath(doc, [...p, 'perIp', 'rps'])));
      setPath(doc, [...p, 'perIp', 'burst'], numberOrKeep('rl-ip-burst', getPath(doc, [...p, 'perIp', 'burst'])));
      setPath(doc, [...p, 'perUser', 'rps'], numberOrKeep('rl-user-rps', getPath(doc, [...p, 'perUser', 'rps'])));
      setPath(doc, [...p, 'perUser', 'burst'], numberOrKeep('rl-user-burst', getPath(doc, [...p, 'perUser', 'burst'])));
    }, 'op.change.rateLimits');
  });
  $('pow-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const d = Number($('pow-difficulty').value);
    if (!Number.isInteger(d) || d < 0) {
      showChange('op.change.badDifficulty', {}, false);
      return;
    }
    // A solve time would override the difficulty: clear it.
    changeSettings((doc) => {
      setPath(doc, ['pow', 'difficulty'], d);
      delete doc.pow.solveSeconds;
    }, 'op.change.difficulty', { d });
  });
  $('pow-seconds-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const sec = Number($('pow-solve-seconds').value);
    if (!Number.isFinite(sec) || sec < 0) {
      showChange('op.change.badSolve', {}, false);
      return;
    }
    changeSettings((doc) => {
      setPath(doc, ['pow', 'solveSeconds'], sec);
      if (sec === 0) delete doc.pow.solveSeconds;
    }, 'op.change.solve', { s: sec });
  });
  $('block-user-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const u = $('block-user-input').value.trim();
    if (!/^\d+$/.test(u)) {
      showChange('op.change.badUser', {}, false);
      return;
    }
    $('block-user-input').value = '';
    changeSettings((doc) => {
      const list = getPath(doc, ['blocklist', 'users']) || [];
      if (!list.map(String).includes(u)) list.push(u);
      setPath(doc, ['blocklist', 'users'], list);
    }, 'op.change.blockedUser', { v: u });
  });
  $('block-cidr-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    let c = $('block-cidr-input').value.trim();
    if (!/^[0-9a-fA-F:.]+(\/\d{1,3})?$/.test(c)) {
      showChange('op.change.badCidr', {}, false);
      return;
    }
    if (!c.includes('/')) c += c.includes(':') ? '/128' : '/32';
    $('block-cidr-input').value = '';
    changeSettings((doc) => {
      const list = getPath(doc, ['blocklist', 'cidrs']) || [];
      if (!list.includes(c)) list.push(c);
      setPath(doc, ['blocklist', 'cidrs'], list);
    }, 'op.change.blockedCidr', { v: c });
  });
  $('settings-json').addEventListener('focus', () => {
    if (!Number.isFinite(op.settingsDocVersion) && op.settings) op.settingsDocVersion = Number(op.settings.version);
  });
  $('settings-apply').addEventListener('click', async () => {
    let doc;
    try {
      doc = JSON.parse($('settings-json').value);
    } catch (err) {
      showChange('op.change.badJson', { why: err.message }, false);
      return;
    }
    // The document is written with the version it was shown at, not the
    // one in its text (which the operator may have edited).
    await putSettings(doc, op.settingsDocVersion, 'op.change.docSaved');
  });
  for (const b of document.querySelectorAll('[data-preset]')) {
    b.addEventListener('click', async () => {
      const name = b.dataset.preset;
      const r = await api('POST', '/settings/preset/' + encodeURIComponent(name), undefined, ifMatch(Number(op.settings && op.settings.version)));
      const label = i18n.has('preset.' + name) ? t('preset.' + name) : name;
      if (r.ok) {
        if (r.body && typeof r.body === 'object') {
          op.settings = r.body;
          renderSettings(true);
        } else loadSettings(true);
        await showChange('op.change.preset', { name: label });
      } else if (r.status === 412 && r.error === 'VERSION_CONFLICT') {
        showConflict('settings', op.settings, r.body && r.body.current);
      } else showChange('op.change.presetRefused', { why: refusal(r) }, false);
    });
  }
}

// ---------- audit ----------

async function loadAudit() {
  const r = await api('GET', '/audit');
  if (!r.ok) return [];
  const entries = Array.isArray(r.body) ? r.body : (r.body && r.body.entries) || [];
  op.audit = entries;
  renderAudit();
  return entries;
}

function renderAudit() {
  const entries = op.audit || [];
  const ul = $('audit-list');
  const freshId = ul.dataset.fresh;
  ul.replaceChildren();
  for (const e of entries.slice(0, 200)) {
    const li = document.createElement('li');
    li.id = 'audit-' + e.id;
    if (String(e.id) === freshId) li.className = 'fresh';
    li.dataset.action = e.action || '';
    li.append(auditText(e));
    const lines = auditLines(e.body);
    if (lines.length) {
      const diff = document.createElement('ul');
      diff.className = 'diff';
      for (const line of lines) {
        const d = document.createElement('li');
        d.textContent = line;
        diff.append(d);
      }
      li.append(diff);
    }
    ul.append(li);
  }
}

// auditText is an entry's first line: when, who, what.
function auditText(e) {
  const at = Date.parse(e.at);
  const action = i18n.has('audit.action.' + e.action) ? t('audit.action.' + e.action) : e.action || '';
  return (Number.isFinite(at) ? i18n.dateTime(at) : e.at || '') + ' · ' + t('audit.actor', { actor: e.actor ?? '?' }) + ' · ' + action;
}

// MAX_AUDIT_LINES bounds the lines one entry shows.
const MAX_AUDIT_LINES = 12;

// auditLines reads an entry's body as a person would (conflict.js,
// changeLines): what changed, not the document, in the words and formats
// of the conflict display ("admission rate: 20 → 50").
function auditLines(body) {
  return changeLines(body, MAX_AUDIT_LINES, (n) => t('op.audit.more', { n }), (c) =>
    'was' in c || 'now' in c
      ? t('conflict.change', { field: fieldLabel(c.path), was: shown(c.path, c.was), now: shown(c.path, c.now) })
      : t('op.audit.value', { field: fieldLabel(c.path), value: shown(c.path, c.value) }),
  );
}

// showChange reports a change and, when it is audited, the audit entry it
// produced.
async function showChange(key, params = {}, audited = true) {
  op.change = { key, params, audit: null };
  renderChange();
  if (!audited) return;
  const entries = await loadAudit();
  if (entries.length && op.change && op.change.key === key) {
    const e = entries[0];
    $('audit-list').dataset.fresh = String(e.id);
    const li = $('audit-' + e.id);
    if (li) li.className = 'fresh';
    op.change.audit = e;
    renderChange();
  }
}

function renderChange() {
  const el = $('change-result');
  const c = op.change;
  if (!c) {
    el.textContent = '';
    return;
  }
  let text = t(c.key, c.params);
  // The entry's body (the whole settings document) is in the audit list.
  if (c.audit) text += ' ' + t('op.change.audit', { id: c.audit.id, entry: auditText(c.audit) });
  el.textContent = text;
}

// ---------- start ----------

function startPolling() {
  for (const tm of op.timers) clearInterval(tm);
  if (op.view === 'report') {
    loadReport();
    op.timers = [setInterval(loadReport, REPORT_EVERY)];
    return;
  }
  loadSales();
  loadSettings();
  loadDefense();
  loadAudit();
  op.timers = [setInterval(loadFigures, 1000), setInterval(loadDefense, 2000), setInterval(loadAudit, 5000), setInterval(loadSales, 10000)];
}

// ---------- the report after the drop ----------

// loadReport reads the sale's report and shows it; once the sale has
// ended the report is final and is not read again.
async function loadReport() {
  if (!op.saleId || op.reportInFlight || (op.report && op.report.final)) return;
  op.reportInFlight = true;
  const r = await api('GET', '/sales/' + encodeURIComponent(op.saleId) + '/report');
  op.reportInFlight = false;
  if (!r.ok) {
    if (r.networkError) showError('NETWORK');
    else if (r.status !== 401 && r.status !== 403) showError(r.error || 'HTTP_' + r.status, r.message);
    return;
  }
  op.report = r.body;
  renderReport(op.report, i18n, $);
}

// downloadReport saves the report as JSON or CSV: fetched with the
// operator's token (a plain link would carry none), then handed to the
// browser as a file.
async function downloadReport(format) {
  await downloadFile('/sales/' + encodeURIComponent(op.saleId) + '/report?format=' + format, 'sale-' + op.saleId + '-report.' + format);
}

// downloadFile saves an admin API answer (a report, the codes, the
// allowlist) as a file named name.
async function downloadFile(apiPath, name) {
  const path = ADMIN + apiPath;
  let res;
  try {
    res = await fetch(path, { headers: { Authorization: 'Bearer ' + op.token }, cache: 'no-store' });
  } catch {
    showError('NETWORK');
    return;
  }
  if (!res.ok) {
    showError('HTTP_' + res.status);
    return;
  }
  const url = URL.createObjectURL(await res.blob());
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// ---------- access rule, codes, allowlist ----------

// accessBody reads an access rule from a rule select, the tier 1 and
// public start inputs and the draw-by-tier box: {rule, tiers, publicFrom,
// drawByTier}, or null for a start that is not a time.
function accessBody(ruleId, membersId, publicId, drawId) {
  const a = { rule: $(ruleId).value };
  if (drawId && $(drawId).checked) a.drawByTier = true;
  const when = (id) => {
    const v = $(id).value;
    if (!v) return '';
    const d = new Date(v);
    return Number.isNaN(d.getTime()) ? null : d.toISOString();
  };
  const members = when(membersId);
  const pub = when(publicId);
  if (members === null || pub === null) return null;
  if (members) a.tiers = [{ tier: 1, joinFrom: members }];
  if (pub) a.publicFrom = pub;
  return a;
}

function ruleLabelOf(rule) {
  return t('acc.' + (rule || 'open'));
}

// renderAccess shows the chosen sale's rule and fills the form with it
// (a field being edited is left alone).
function renderAccess() {
  const a = (op.sale && op.sale.access) || { rule: 'open' };
  const tier1 = (a.tiers || []).find((x) => x.tier === 1);
  const parts = [ruleLabelOf(a.rule)];
  if (tier1 && tier1.joinFrom) parts.push(t('acc.membersFrom', { at: i18n.dateTime(Date.parse(tier1.joinFrom)) }));
  if (a.publicFrom) parts.push(t('acc.publicFrom', { at: i18n.dateTime(Date.parse(a.publicFrom)) }));
  if (a.drawByTier) parts.push(t('acc.drawnByTier'));
  $('acc-current').textContent = t('acc.current', { rule: parts.join('; ') });
  if ($('acc-draw').dataset.dirty !== '1') $('acc-draw').checked = a.drawByTier === true;
  setIfClean('acc-rule', a.rule || 'open');
  setIfClean('acc-members', tier1 && tier1.joinFrom ? localInputValue(Date.parse(tier1.joinFrom)) : '');
  setIfClean('acc-public', a.publicFrom ? localInputValue(Date.parse(a.publicFrom)) : '');
}

// ACCESS_FIELDS are the access form's fields: once the operator changed
// one, the figures' refresh leaves it alone until the form is applied (a
// rule chosen, then a date typed, must not flip back to the sale's rule
// under the operator's hand).
const ACCESS_FIELDS = ['acc-rule', 'acc-members', 'acc-public', 'acc-draw'];

function setIfClean(id, v) {
  if ($(id).dataset.dirty !== '1') setIfIdle(id, v);
}

function accResult(key, params) {
  $('acc-result').textContent = t(key, params);
}

async function applyAccess(ev) {
  ev.preventDefault();
  const access = accessBody('acc-rule', 'acc-members', 'acc-public', 'acc-draw');
  if (!access) {
    accResult('acc.badTime');
    return;
  }
  if (await saleWrite('PATCH', '', { access }, 'op.change.access', { rule: ruleLabelOf(access.rule) }, false)) {
    for (const id of ACCESS_FIELDS) delete $(id).dataset.dirty;
    renderAccess();
  }
}

async function postCodes(body) {
  if (!op.saleId) return;
  const r = await api('POST', '/sales/' + encodeURIComponent(op.saleId) + '/codes', body);
  if (r.ok && r.body && Array.isArray(r.body.codes)) {
    accResult('acc.codesMade', { n: r.body.codes.length });
    showChange('acc.codesMade', { n: r.body.codes.length });
  } else {
    accResult('op.change.refused', { why: refusal(r) });
  }
}

// uploadAllowlist sends the chosen CSV file as the sale's allowlist, with
// the sale's If-Match: the upload moves the sale's version.
async function uploadAllowlist(ev) {
  ev.preventDefault();
  const f = $('allowlist-file').files[0];
  if (!op.saleId || !f) return;
  const headers = { 'Content-Type': 'text/csv', Authorization: 'Bearer ' + op.token, Accept: 'application/json', ...ifMatch(saleVersion()) };
  let res;
  let body = null;
  try {
    res = await fetch(ADMIN + '/sales/' + encodeURIComponent(op.saleId) + '/allowlist', { method: 'PUT', headers, body: await f.text(), cache: 'no-store' });
    body = await res.json().catch(() => null);
  } catch {
    showError('NETWORK');
    return;
  }
  if (res.ok && body) {
    accResult('acc.listDone', { n: body.users });
    $('allowlist-file').value = '';
    showChange('acc.listDone', { n: body.users });
    loadFigures();
    return;
  }
  if (res.status === 412 && body && body.current) {
    showConflict('sale', op.pinned || op.sale, body.current);
    return;
  }
  accResult('op.change.refused', { why: refusal({ error: body && body.error, message: body && body.message, status: res.status }) });
}

function wireAccess() {
  $('acc-form').addEventListener('submit', applyAccess);
  for (const id of ACCESS_FIELDS) {
    for (const ev of ['input', 'change']) $(id).addEventListener(ev, () => { $(id).dataset.dirty = '1'; });
  }
  $('codes-gen-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    postCodes({ count: Number($('codes-count').value), tier: Number($('codes-tier').value) });
  });
  $('codes-multi-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    postCodes({ codes: [$('codes-multi').value.trim()], maxUses: Number($('codes-uses').value), tier: Number($('codes-multi-tier').value) });
  });
  $('codes-download').addEventListener('click', () => downloadFile('/sales/' + encodeURIComponent(op.saleId) + '/codes.csv', 'sale-' + op.saleId + '-codes.csv'));
  $('allowlist-download').addEventListener('click', () => downloadFile('/sales/' + encodeURIComponent(op.saleId) + '/allowlist', 'sale-' + op.saleId + '-allowlist.csv'));
  $('allowlist-form').addEventListener('submit', uploadAllowlist);
}

// relabel shows everything the script wrote in the newly chosen language.
function relabel() {
  renderSigned();
  renderError();
  renderSales();
  renderFigures(false);
  renderDefense(false);
  if (op.settings) renderSettings();
  renderAudit();
  renderChange();
  renderConflict();
  if (op.report) renderReport(op.report, i18n, $);
  renderShadowQ();
  if (op.createResult) setCreateResult(op.createResult.key, op.createResult.params);
  for (const b of document.querySelectorAll('#cs-items [data-remove-n]')) b.setAttribute('aria-label', t('op.item.removeLabel', { n: Number(b.dataset.removeN) }));
  for (const row of document.querySelectorAll('#cs-items .item-row')) row.querySelector('legend').textContent = t('op.item.legend', { n: Number(row.dataset.n) });
}

function init() {
  i18n = setupLanguage(document, window, relabel);
  $('op-signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const tok = $('op-token').value.trim();
    $('op-token').value = '';
    if (!looksLikeJWT(tok)) {
      showError('TOKEN_SHAPE');
      return;
    }
    signIn(tok);
  });
  $('op-signout').addEventListener('click', signOut);
  $('create-sale').addEventListener('submit', createSale);
  $('cs-add-item').addEventListener('click', () => addItemRow());
  wireControls();
  wireAccess();
  wireSettings();
  $('report-json').addEventListener('click', () => downloadReport('json'));
  $('report-csv').addEventListener('click', () => downloadReport('csv'));
  const params = new URLSearchParams(location.search);
  const sale = params.get('sale');
  if (params.get('view') === 'report' && sale && /^\d+$/.test(sale)) {
    // The report view: the chosen sale's report alone.
    op.view = 'report';
    op.saleId = sale;
    document.body.classList.add('report-view');
    $('report').hidden = false;
    $('report-back').href = '/operator?sale=' + encodeURIComponent(sale);
  }
  addItemRow({ productId: 501, quantity: 100, priceCents: 1999, currency: 'EUR', name: t('op.create.demoItem') });
  $('cs-starts').value = localInputValue(Date.now() + 2 * 60 * 1000);
  $('cs-name').value = t('op.create.demoName');
  const token = acquireToken(TOKEN_KEY);
  if (!token) {
    signOut();
    return;
  }
  signIn(token);
  if (op.view !== 'report' && sale && /^\d+$/.test(sale)) selectSale(sale);
}

init();
