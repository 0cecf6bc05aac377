// Operator console: sales, live figures, bot-defense knobs, audit log.
import { request } from './api.js';
import { acquireToken, clearToken, decodeClaims, looksLikeJWT, saveToken } from './auth.js';
import { Series, drawChart, getPath, pivotCounters, ratePerSecond, setPath, shadowPaths } from './charts.js';
import { formatCents } from './format.js';

const TOKEN_KEY = 'flashsale.operatorToken';
const ADMIN = '/api/admin';
const HISTORY = 300; // points: five minutes at one poll a second

// The bot-defense rules (defense/settings.go), for shadow mode.
const SHADOW_RULES = ['blocklist', 'perIp', 'perPrefix', 'perUser', 'pow'];
const RULE_LABELS = { blocklist: 'Blocklist', perIp: 'Rate limit per IP', perPrefix: 'Rate limit per network prefix', perUser: 'Rate limit per user', pow: 'Proof of work' };

const $ = (id) => document.getElementById(id);

const op = {
  token: '',
  saleId: '',
  sales: [],
  settings: null,
  series: new Map(), // key → Series
  lastAdmitted: null, // {t, v}
  lastDefense: null, // {t, totals: {outcome: n}}
  timers: [],
  figuresInFlight: false,
};

function series(key) {
  if (!op.series.has(key)) op.series.set(key, new Series(HISTORY));
  return op.series.get(key);
}

// ---------- errors, sign-in ----------

function showError(code, message) {
  const el = $('error');
  if (!code) {
    el.textContent = '';
    el.removeAttribute('data-error');
    return;
  }
  el.dataset.error = code;
  const text = {
    UNAUTHENTICATED: 'The operator token is missing, invalid or expired. Sign in again.',
    FORBIDDEN: 'This token is not an operator token.',
    NETWORK: 'Cannot reach the server; retrying.',
  }[code];
  el.textContent = text || (message ? code + ': ' + message : 'Error ' + code);
}

// api calls the admin API and handles sign-in failures in one place.
async function api(method, path, body) {
  const r = await request(method, ADMIN + path, { token: op.token, body });
  if (r.status === 401) {
    signOut();
    showError('UNAUTHENTICATED');
  } else if (r.status === 403) {
    showError('FORBIDDEN');
  }
  return r;
}

function signIn(token) {
  op.token = token;
  saveToken(TOKEN_KEY, token);
  const claims = decodeClaims(token);
  $('op-signed').textContent = claims && claims.sub ? 'Operator ' + claims.sub : 'Signed in';
  $('op-signin').hidden = true;
  $('op-signout').hidden = false;
  $('console').hidden = false;
  showError('');
  startPolling();
}

function signOut() {
  op.token = '';
  clearToken(TOKEN_KEY);
  for (const t of op.timers) clearInterval(t);
  op.timers = [];
  $('op-signed').textContent = '';
  $('op-signin').hidden = false;
  $('op-signout').hidden = true;
  $('console').hidden = true;
}

// ---------- sales ----------

async function loadSales() {
  const r = await api('GET', '/sales');
  if (!r.ok) return;
  op.sales = Array.isArray(r.body) ? r.body : (r.body && r.body.sales) || [];
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
    meta.textContent = ' ' + (s.state || '') + ' · starts ' + (s.startsAt || '') + ' · ' + (s.admissionRatePerSecond ?? '?') + '/s';
    li.append(btn, meta);
    ul.append(li);
  }
  if (!op.sales.length) {
    const li = document.createElement('li');
    li.className = 'muted';
    li.textContent = 'No sales yet.';
    ul.append(li);
  }
}

function selectSale(id) {
  if (op.saleId !== id) {
    op.series.clear();
    op.lastAdmitted = null;
    $('charts').replaceChildren();
    $('fig-items').replaceChildren();
    $('rate-input').value = '';
  }
  op.saleId = id;
  $('figures-empty').hidden = true;
  $('figures-body').hidden = false;
  loadSales();
  loadFigures();
}

function addItemRow(productId = '', quantity = '', price = '') {
  const n = $('cs-items').children.length + 1;
  const row = document.createElement('div');
  row.className = 'row';
  const mk = (label, name, value, min) => {
    const id = 'cs-' + name + '-' + n;
    const l = document.createElement('label');
    l.htmlFor = id;
    l.textContent = label;
    const i = document.createElement('input');
    i.id = id;
    i.name = name;
    i.type = 'number';
    i.min = String(min);
    i.step = '1';
    i.size = 7;
    i.required = true;
    i.value = String(value);
    return [l, i];
  };
  row.append(...mk('Product', 'productId', productId, 1), ...mk('Quantity', 'quantity', quantity, 1), ...mk('Price (cents)', 'priceCents', price, 0));
  if (n > 1) {
    const rm = document.createElement('button');
    rm.type = 'button';
    rm.className = 'secondary';
    rm.textContent = 'Remove';
    rm.setAttribute('aria-label', 'Remove item ' + n);
    rm.addEventListener('click', () => row.remove());
    row.append(rm);
  }
  $('cs-items').append(row);
}

function localInputValue(ms) {
  const d = new Date(ms);
  const p = (x) => String(x).padStart(2, '0');
  return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + 'T' + p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
}

async function createSale(ev) {
  ev.preventDefault();
  const starts = new Date($('cs-starts').value);
  if (Number.isNaN(starts.getTime())) {
    $('create-result').textContent = 'Enter a start time.';
    return;
  }
  const items = [...$('cs-items').children].map((row) => ({
    productId: Number(row.querySelector('[name=productId]').value),
    quantity: Number(row.querySelector('[name=quantity]').value),
    priceCents: Number(row.querySelector('[name=priceCents]').value),
  }));
  const body = {
    name: $('cs-name').value.trim(),
    startsAt: starts.toISOString(),
    admissionRatePerSecond: Number($('cs-rate').value),
    items,
  };
  $('cs-submit').disabled = true;
  const r = await api('POST', '/sales', body);
  $('cs-submit').disabled = false;
  if (r.status === 201 || r.ok) {
    $('create-result').textContent = 'Created sale #' + r.body.id + ' (' + r.body.state + ').';
    await loadSales();
    selectSale(String(r.body.id));
    showChange('Sale #' + r.body.id + ' created');
  } else {
    $('create-result').textContent = 'Not created: ' + (r.message || r.error || 'HTTP ' + r.status);
  }
}

// ---------- live figures ----------

function itemFigures(it) {
  const f = it.figures && typeof it.figures === 'object' ? { ...it, ...it.figures } : it;
  return { id: String(f.id ?? f.itemId), productId: f.productId, quantity: f.quantity, priceCents: f.priceCents, remaining: f.remaining, sold: f.sold, paid: f.paid, expired: f.expired, cancelled: f.cancelled, rejected: f.rejected };
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
  const s = r.body;
  const t = Date.now();
  const q = s.queue || {};
  $('figures-title').textContent = 'Live figures · #' + s.id + ' ' + (s.name || '');
  $('fig-state').textContent = s.state || '';
  $('fig-joined').textContent = num(q.joined);
  $('fig-waiting').textContent = num(q.waiting);
  $('fig-admitted').textContent = num(q.admitted);
  $('fig-rate-setting').textContent = num(s.admissionRatePerSecond) + '/s';
  if (document.activeElement !== $('rate-input') && $('rate-input').value === '') $('rate-input').value = s.admissionRatePerSecond ?? '';

  const cur = { t, v: Number(q.admitted) };
  const rate = ratePerSecond(op.lastAdmitted, cur);
  if (Number.isFinite(cur.v)) op.lastAdmitted = cur;
  $('fig-admit-rate').textContent = rate === null ? '–' : rate.toFixed(1);
  if (rate !== null) series('admitRate').push(t, rate);
  series('waiting').push(t, Number(q.waiting));

  const tbody = $('fig-items');
  let remaining = 0, sold = 0, paid = 0;
  const rows = [];
  for (const it of (s.items || []).map(itemFigures)) {
    remaining += Number(it.remaining) || 0;
    sold += Number(it.sold) || 0;
    paid += Number(it.paid) || 0;
    const tr = document.createElement('tr');
    tr.id = 'fig-item-' + it.id;
    const cells = [
      '#' + it.id + (it.productId !== undefined ? ' (product ' + it.productId + ', ' + formatCents(Number(it.priceCents)) + ')' : ''),
      num(it.quantity), num(it.remaining), num(it.sold), num(it.paid), num(it.expired), num(it.cancelled), num(it.rejected),
    ];
    cells.forEach((c, i) => {
      const cell = document.createElement(i === 0 ? 'th' : 'td');
      if (i === 0) cell.scope = 'row';
      cell.textContent = c;
      tr.append(cell);
    });
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
  series('remaining').push(t, remaining);
  series('sold').push(t, sold);
  series('paid').push(t, paid);

  const charts = $('charts');
  drawChart(charts, 'admitRate', 'Admissions per second', series('admitRate').values(), rate === null ? '–' : rate.toFixed(1));
  drawChart(charts, 'waiting', 'Waiting', series('waiting').values(), num(q.waiting));
  drawChart(charts, 'remaining', 'Remaining (all items)', series('remaining').values(), String(remaining));
  drawChart(charts, 'sold', 'Sold (pending + paid)', series('sold').values(), String(sold));
  drawChart(charts, 'paid', 'Paid', series('paid').values(), String(paid));
}

function num(v) {
  return v === undefined || v === null || v === '' ? '–' : String(v);
}

async function applyRate(ev) {
  ev.preventDefault();
  if (!op.saleId) return;
  const n = Number($('rate-input').value);
  if (!Number.isInteger(n) || n < 1) {
    showChange('The admission rate must be a whole number of 1 or more.');
    return;
  }
  const r = await api('PATCH', '/sales/' + encodeURIComponent(op.saleId), { admissionRatePerSecond: n });
  // A sale change is not in the audit log (only settings changes are):
  // report it without an audit entry, which would be an unrelated one.
  if (r.ok) $('change-result').textContent = 'Admission rate set to ' + n + '/s.';
  else showChange('Not changed: ' + (r.message || r.error || 'HTTP ' + r.status));
  loadFigures();
}

// ---------- defense counters ----------

async function loadDefense() {
  const r = await api('GET', '/defense');
  if (!r.ok || !r.body) return;
  const { outcomes, rows } = pivotCounters(r.body);
  const table = $('defense-table');
  const head = document.createElement('thead');
  const hr = document.createElement('tr');
  for (const h of ['Rule', ...outcomes]) {
    const th = document.createElement('th');
    th.scope = 'col';
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
    th.textContent = row.rule;
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

  const t = Date.now();
  const charts = $('defense-charts');
  for (const o of outcomes) {
    const rate = op.lastDefense ? ratePerSecond({ t: op.lastDefense.t, v: op.lastDefense.totals[o] ?? 0 }, { t, v: totals[o] }) : null;
    if (rate !== null) series('def-' + o).push(t, rate);
    drawChart(charts, 'def-' + o, o + ' per second', series('def-' + o).values(), rate === null ? '–' : rate.toFixed(1));
  }
  op.lastDefense = { t, totals };
}

// ---------- settings ----------

async function loadSettings() {
  const r = await api('GET', '/settings');
  if (!r.ok || !r.body) return null;
  op.settings = r.body;
  renderSettings();
  return r.body;
}

function setIfIdle(id, v) {
  const el = $(id);
  if (document.activeElement !== el) el.value = v === undefined || v === null ? '' : String(v);
}

function renderSettings() {
  const s = op.settings || {};
  setIfIdle('rl-ip-rps', getPath(s, ['rateLimit', 'perIp', 'rps']));
  setIfIdle('rl-ip-burst', getPath(s, ['rateLimit', 'perIp', 'burst']));
  setIfIdle('rl-user-rps', getPath(s, ['rateLimit', 'perUser', 'rps']));
  setIfIdle('rl-user-burst', getPath(s, ['rateLimit', 'perUser', 'burst']));
  setIfIdle('pow-difficulty', getPath(s, ['pow', 'difficulty']));
  renderChips('block-users', getPath(s, ['blocklist', 'users']) || [], 'users', 'Unblock user ');
  renderChips('block-cidrs', getPath(s, ['blocklist', 'cidrs']) || [], 'cidrs', 'Unblock network ');
  setIfIdle('pow-solve-seconds', getPath(s, ['pow', 'solveSeconds']));
  $('preset-name').textContent = s.preset || '–';
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
    cb.addEventListener('change', () =>
      changeSettings((doc) => {
        setPath(doc, path, cb.checked);
        if (path[0] === 'shadow' && !cb.checked) delete doc.shadow[path[1]];
      }, 'Shadow mode ' + (cb.checked ? 'on' : 'off') + ' for ' + path.slice(1).join('.')),
    );
    const l = document.createElement('label');
    l.htmlFor = id;
    l.textContent = ' ' + (RULE_LABELS[path[path.length - 1]] || path.join('.'));
    row.append(cb, l);
    box.append(row);
  }
  if (document.activeElement !== $('settings-json')) $('settings-json').value = JSON.stringify(s, null, 2);
}

function renderChips(listId, values, field, label) {
  const ul = $(listId);
  ul.replaceChildren();
  for (const v of values) {
    const li = document.createElement('li');
    li.append(String(v));
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'secondary';
    b.textContent = '×';
    b.setAttribute('aria-label', label + v);
    b.addEventListener('click', () =>
      changeSettings((doc) => {
        const list = getPath(doc, ['blocklist', field]) || [];
        setPath(doc, ['blocklist', field], list.filter((x) => String(x) !== String(v)));
      }, label + v),
    );
    li.append(b);
    ul.append(li);
  }
}

// changeSettings reads the current document, edits it and writes it whole,
// so that fields this page does not know survive.
async function changeSettings(edit, what) {
  const current = await loadSettings();
  if (!current) {
    showChange('Not changed: cannot read the settings.');
    return;
  }
  const doc = structuredClone(current);
  edit(doc);
  const r = await api('PUT', '/settings', doc);
  if (r.ok) {
    op.settings = r.body && typeof r.body === 'object' ? r.body : doc;
    renderSettings();
    await showChange(what);
  } else {
    showChange('Not changed: ' + (r.message || r.error || 'HTTP ' + r.status));
    loadSettings();
  }
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
    }, 'Rate limits changed');
  });
  $('pow-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const d = Number($('pow-difficulty').value);
    if (!Number.isInteger(d) || d < 0) {
      showChange('The difficulty must be a whole number of 0 or more.');
      return;
    }
    // A solve time would override the difficulty: clear it.
    changeSettings((doc) => {
      setPath(doc, ['pow', 'difficulty'], d);
      delete doc.pow.solveSeconds;
    }, 'Proof-of-work difficulty set to ' + d + ' expected hashes');
  });
  $('pow-seconds-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const sec = Number($('pow-solve-seconds').value);
    if (!Number.isFinite(sec) || sec < 0) {
      showChange('The solve time must be 0 or more seconds.');
      return;
    }
    changeSettings((doc) => {
      setPath(doc, ['pow', 'solveSeconds'], sec);
      if (sec === 0) delete doc.pow.solveSeconds;
    }, 'Proof-of-work solve time set to ' + sec + ' s');
  });
  $('block-user-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const u = $('block-user-input').value.trim();
    if (!/^\d+$/.test(u)) {
      showChange('A user id is a number.');
      return;
    }
    $('block-user-input').value = '';
    changeSettings((doc) => {
      const list = getPath(doc, ['blocklist', 'users']) || [];
      if (!list.map(String).includes(u)) list.push(u);
      setPath(doc, ['blocklist', 'users'], list);
    }, 'User ' + u + ' blocked');
  });
  $('block-cidr-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    let c = $('block-cidr-input').value.trim();
    if (!/^[0-9a-fA-F:.]+(\/\d{1,3})?$/.test(c)) {
      showChange('Enter an address or a network such as 203.0.113.0/24.');
      return;
    }
    if (!c.includes('/')) c += c.includes(':') ? '/128' : '/32';
    $('block-cidr-input').value = '';
    changeSettings((doc) => {
      const list = getPath(doc, ['blocklist', 'cidrs']) || [];
      if (!list.includes(c)) list.push(c);
      setPath(doc, ['blocklist', 'cidrs'], list);
    }, 'Network ' + c + ' blocked');
  });
  $('settings-apply').addEventListener('click', async () => {
    let doc;
    try {
      doc = JSON.parse($('settings-json').value);
    } catch (err) {
      showChange('The document is not valid JSON: ' + err.message);
      return;
    }
    const r = await api('PUT', '/settings', doc);
    if (r.ok) {
      op.settings = r.body || doc;
      $('settings-json').blur();
      renderSettings();
      await showChange('Settings document saved');
    } else showChange('Not saved: ' + (r.message || r.error || 'HTTP ' + r.status));
  });
  for (const b of document.querySelectorAll('[data-preset]')) {
    b.addEventListener('click', async () => {
      const name = b.dataset.preset;
      const r = await api('POST', '/settings/preset/' + encodeURIComponent(name));
      if (r.ok) {
        if (r.body && typeof r.body === 'object') {
          op.settings = r.body;
          renderSettings();
        } else loadSettings();
        await showChange('Preset "' + name + '" applied');
      } else showChange('Preset not applied: ' + (r.message || r.error || 'HTTP ' + r.status));
    });
  }
}

// ---------- audit ----------

async function loadAudit() {
  const r = await api('GET', '/audit');
  if (!r.ok) return [];
  const entries = Array.isArray(r.body) ? r.body : (r.body && r.body.entries) || [];
  const ul = $('audit-list');
  const freshId = ul.dataset.fresh;
  ul.replaceChildren();
  for (const e of entries.slice(0, 200)) {
    const li = document.createElement('li');
    li.id = 'audit-' + e.id;
    if (String(e.id) === freshId) li.className = 'fresh';
    li.textContent = auditText(e);
    ul.append(li);
  }
  return entries;
}

function auditText(e, withBody = true) {
  let body = '';
  if (withBody && e.body !== undefined && e.body !== null) {
    body = typeof e.body === 'string' ? e.body : JSON.stringify(e.body);
    if (body.length > 400) body = body.slice(0, 400) + '…';
  }
  return (e.at || '') + ' · ' + (e.actor ?? '?') + ' · ' + (e.action || '') + (body ? ' · ' + body : '');
}

// showChange reports a change and the audit entry it produced.
async function showChange(what) {
  const el = $('change-result');
  el.textContent = what + '.';
  const entries = await loadAudit();
  if (entries.length) {
    const e = entries[0];
    $('audit-list').dataset.fresh = String(e.id);
    const li = $('audit-' + e.id);
    if (li) li.className = 'fresh';
    // The entry's body (the whole settings document) is in the audit list.
    el.textContent = what + '. Audit #' + e.id + ': ' + auditText(e, false);
  }
}

// ---------- start ----------

function startPolling() {
  for (const t of op.timers) clearInterval(t);
  loadSales();
  loadSettings();
  loadDefense();
  loadAudit();
  op.timers = [
    setInterval(loadFigures, 1000),
    setInterval(loadDefense, 2000),
    setInterval(loadAudit, 5000),
    setInterval(loadSales, 10000),
  ];
}

function init() {
  $('op-signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('op-token').value.trim();
    $('op-token').value = '';
    if (!looksLikeJWT(t)) {
      showError('TOKEN_SHAPE', 'that does not look like an access token');
      return;
    }
    signIn(t);
  });
  $('op-signout').addEventListener('click', signOut);
  $('create-sale').addEventListener('submit', createSale);
  $('cs-add-item').addEventListener('click', () => addItemRow());
  $('rate-form').addEventListener('submit', applyRate);
  wireSettings();
  addItemRow(501, 100, 1999);
  $('cs-starts').value = localInputValue(Date.now() + 2 * 60 * 1000);
  $('cs-name').value = 'Demo drop';
  const token = acquireToken(TOKEN_KEY);
  if (!token) {
    signOut();
    return;
  }
  signIn(token);
  const sale = new URLSearchParams(location.search).get('sale');
  if (sale && /^\d+$/.test(sale)) selectSale(sale);
}

init();
