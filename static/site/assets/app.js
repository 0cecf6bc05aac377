// Shopper page: the list of sales at "/", one sale at "/sales/{id}".
import { request } from './api.js';
import { acquireToken, clearToken, decodeClaims, expiresInMs, looksLikeJWT, saveToken } from './auth.js';
import { ServerClock } from './clock.js';
import { formatCents, formatCountdown, formatDateTime, formatEta } from './format.js';
import { buyWithRecovery, findOrder } from './buying.js';
import { QueueClient, startPowSolver } from './queue.js';

const TOKEN_KEY = 'flashsale.token';
const API = '/api/flash-sales';

const $ = (id) => document.getElementById(id);

const MESSAGES = {
  UNAUTHENTICATED: 'Your sign-in is missing or has expired. Please sign in again.',
  FORBIDDEN: 'You are not allowed to do this.',
  BLOCKED: 'Access from this account or network has been blocked.',
  NOT_FOUND: 'This sale does not exist.',
  INVALID: 'The page sent something the server did not understand. Please reload.',
  TOO_LARGE: 'The page sent too much data. Please reload.',
  POW_FAILED: 'The browser check failed; trying again.',
  POW_REJECTED: 'The browser check kept failing. Please reload the page.',
  NETWORK: 'The connection to the shop was lost; retrying.',
};

const page = {
  token: '',
  claims: null,
  clock: new ServerClock(),
  saleId: '',
  sale: null,
  opensAtMs: NaN,
  queue: null,
  queueState: '',
  maxPosition: 0,
  lastAnnounce: 0,
  admission: null, // {token, expiresAtMs, items: Map itemId → purchaseUrl}
  soldOut: new Set(),
  buyBlockedUntil: 0, // performance.now() until which buying waits (rate limit)
  busy: false,
  order: null, // {id, status, payable, expiresAtMs}
  orderTimer: null,
  orderMisses: 0,
};

// ---------- errors and sign-in ----------

function showError(code, message) {
  const el = $('error');
  if (!code) {
    el.textContent = '';
    el.removeAttribute('data-error');
    return;
  }
  el.dataset.error = code;
  el.textContent = MESSAGES[code] || message || 'Something went wrong (' + code + ').';
}

function renderSignin() {
  const signedIn = !!page.token;
  $('signin').hidden = signedIn;
  $('signout').hidden = !signedIn;
  page.claims = signedIn ? decodeClaims(page.token) : null;
  let who = page.claims && page.claims.sub ? 'Signed in as user ' + page.claims.sub : signedIn ? 'Signed in' : 'Not signed in';
  const now = page.clock.synced ? page.clock.now() : Date.now();
  if (signedIn && expiresInMs(page.claims, now) <= 0) who += ' (sign-in expired: please sign in again)';
  $('signed-in').textContent = who;
}

function setToken(token) {
  page.token = token;
  if (token) saveToken(TOKEN_KEY, token);
  else clearToken(TOKEN_KEY);
  renderSignin();
}

function wireSignin() {
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('token-input').value.trim();
    $('token-input').value = '';
    if (!looksLikeJWT(t)) {
      showError('TOKEN_SHAPE', 'That does not look like an access token.');
      return;
    }
    showError('');
    setToken(t);
    if (page.saleId) startQueue();
  });
  $('signout').addEventListener('click', () => {
    stopQueue();
    setToken('');
    $('queue-state').textContent = 'not joined';
  });
}

// ---------- clock ----------

function sampleClock(r) {
  if (r && r.ok && r.body && Number.isFinite(r.body.serverTimeMs)) {
    page.clock.addSample(r.body.serverTimeMs, r.sentAt, r.receivedAt, r.ageSeconds);
  }
}

// ---------- sales list ----------

async function showList() {
  $('sales-view').hidden = false;
  const r = await request('GET', API + '/sales');
  if (!r.ok) {
    showError(r.error || 'NETWORK', r.message);
    return;
  }
  const sales = Array.isArray(r.body) ? r.body : [];
  for (const s of sales) {
    if (Number.isFinite(s.serverTimeMs)) {
      page.clock.addSample(s.serverTimeMs, r.sentAt, r.receivedAt, r.ageSeconds);
      break;
    }
  }
  $('sales-empty').hidden = sales.length > 0;
  const ul = $('sales');
  ul.replaceChildren();
  for (const s of sales) {
    const li = document.createElement('li');
    li.id = 'sale-' + s.id;
    const a = document.createElement('a');
    a.href = '/sales/' + encodeURIComponent(s.id);
    a.textContent = s.name || 'Sale ' + s.id;
    const meta = document.createElement('span');
    meta.className = 'muted';
    meta.dataset.startsAt = String(Date.parse(s.startsAt));
    meta.dataset.state = s.state || '';
    li.append(a, ' ', meta);
    ul.append(li);
  }
  tickList();
}

function tickList() {
  for (const el of document.querySelectorAll('#sales [data-starts-at]')) {
    const starts = Number(el.dataset.startsAt);
    const left = page.clock.synced ? page.clock.until(starts) : NaN;
    let text = stateLabel(el.dataset.state);
    if (el.dataset.state === 'SCHEDULED' && Number.isFinite(left)) text = 'opens in ' + formatCountdown(left);
    el.textContent = '· ' + text;
  }
}

function stateLabel(state) {
  switch (state) {
    case 'SCHEDULED':
      return 'coming soon';
    case 'OPEN':
      return 'open now';
    case 'SOLD_OUT':
      return 'sold out';
    case 'ENDED':
      return 'ended';
    default:
      return '';
  }
}

// ---------- one sale ----------

async function loadSale() {
  const r = await request('GET', API + '/sales/' + encodeURIComponent(page.saleId));
  if (r.status === 404) {
    showError('NOT_FOUND');
    $('countdown').textContent = '–';
    return false;
  }
  if (!r.ok) {
    showError(r.error || 'NETWORK', r.message);
    return false;
  }
  sampleClock(r);
  page.sale = r.body;
  if (!Number.isFinite(page.opensAtMs)) page.opensAtMs = Date.parse(page.sale.startsAt);
  for (const it of page.sale.items || []) if (it.soldOut) page.soldOut.add(String(it.id));
  renderSale();
  return true;
}

// refreshSale takes more clock samples soon after load (the best of a few
// round trips wins), then refreshes state and sold-out flags now and then.
function scheduleSaleRefresh(step = 0) {
  const delays = [1500, 4000];
  const delay = step < delays.length ? delays[step] : 60000 + Math.random() * 30000;
  setTimeout(async () => {
    await loadSale();
    scheduleSaleRefresh(step + 1);
  }, delay);
}

function renderSale() {
  const s = page.sale;
  $('sale-name').textContent = s.name || 'Sale ' + s.id;
  document.title = (s.name || 'Sale') + ' · Flash sale';
  const t = $('starts-at');
  t.dateTime = s.startsAt;
  t.textContent = formatDateTime(Date.parse(s.startsAt));
  renderItems();
  renderBanner();
}

function saleState() {
  if (page.queueState === 'SOLD_OUT' || page.queueState === 'ENDED') return page.queueState;
  return page.sale ? page.sale.state : '';
}

function renderBanner() {
  const b = $('sale-banner');
  const st = saleState();
  b.dataset.state = st;
  b.textContent = st === 'SOLD_OUT' ? 'Sold out.' : st === 'ENDED' ? 'This sale has ended.' : '';
}

function renderItems() {
  const ul = $('items');
  const items = (page.sale && page.sale.items) || [];
  const seen = new Set();
  for (const it of items) {
    const id = String(it.id);
    seen.add(id);
    let li = $('item-' + id);
    if (!li) {
      li = document.createElement('li');
      li.id = 'item-' + id;
      li.className = 'item';
      const name = document.createElement('span');
      name.className = 'item-name';
      const price = document.createElement('span');
      price.className = 'price';
      const action = document.createElement('div');
      action.className = 'action';
      action.id = 'action-' + id;
      li.append(name, price, action);
      ul.append(li);
    }
    li.querySelector('.item-name').textContent = 'Product ' + it.productId;
    li.querySelector('.price').textContent = formatCents(it.priceCents);
  }
  if (page.admission) {
    for (const id of page.admission.items.keys()) {
      if (!seen.has(id) && !$('item-' + id)) {
        const li = document.createElement('li');
        li.id = 'item-' + id;
        li.className = 'item';
        const name = document.createElement('span');
        name.className = 'item-name';
        name.textContent = 'Item ' + id;
        const action = document.createElement('div');
        action.className = 'action';
        action.id = 'action-' + id;
        li.append(name, document.createElement('span'), action);
        ul.append(li);
      }
    }
  }
  renderActions();
}

// renderActions puts a buy button in each item's reserved action box once the
// shopper is admitted, and a short note otherwise (same height: no jump).
function renderActions() {
  const admitted = admissionValid();
  const ordering = page.order && (page.order.status === 'PENDING' || page.order.status === 'PAID' || !page.order.status);
  const waitMs = page.buyBlockedUntil - performance.now();
  for (const box of document.querySelectorAll('#items .action')) {
    const id = box.id.slice('action-'.length);
    const url = page.admission && page.admission.items.get(id);
    if (page.order && page.order.status === 'PAID') {
      // One item per sale: after paying there is nothing more to buy.
      setNote(box, String(page.order.itemId) === id ? 'Bought' : 'One item per sale', '');
      continue;
    }
    if (page.soldOut.has(id)) {
      setNote(box, 'Sold out', 'soldout-' + id);
      continue;
    }
    if (!admitted || !url) {
      setNote(box, saleState() === 'ENDED' ? 'Ended' : 'Buy when it is your turn', '');
      continue;
    }
    let btn = $('buy-' + id);
    if (!btn) {
      btn = document.createElement('button');
      btn.type = 'button';
      btn.id = 'buy-' + id;
      btn.dataset.testid = 'buy-' + id;
      btn.addEventListener('click', () => buy(id));
      box.replaceChildren(btn);
    }
    btn.disabled = page.busy || ordering || waitMs > 0;
    btn.textContent = waitMs > 0 ? 'Buy (wait ' + Math.ceil(waitMs / 1000) + ' s)' : 'Buy';
  }
}

function setNote(box, text, id) {
  const first = box.firstElementChild;
  if (first && first.tagName === 'SPAN' && first.textContent === text) return;
  const span = document.createElement('span');
  span.className = 'note';
  if (id) span.id = id;
  span.textContent = text;
  box.replaceChildren(span);
}

function admissionValid() {
  if (!page.admission) return false;
  const exp = Number(page.admission.expiresAtMs);
  if (!Number.isFinite(exp) || !page.clock.synced) return true;
  return page.clock.until(exp) > 0;
}

// ---------- queue ----------

function startQueue() {
  stopQueue();
  if (!page.token) {
    $('join').hidden = true;
    return;
  }
  if (saleState() === 'ENDED') return;
  $('join').hidden = true;
  showError('');
  page.maxPosition = 0;
  const transport = new URLSearchParams(location.search).get('transport') === 'polling' ? 'polling' : 'auto';
  page.queue = new QueueClient({
    saleId: page.saleId,
    token: page.token,
    transport,
    location,
    WebSocketImpl: typeof WebSocket === 'function' ? WebSocket : null,
    request,
    solvePow: startPowSolver,
    serverNow: () => page.clock.now(),
    handlers: {
      onStatus,
      onAdmitted,
      onError: onQueueError,
      onTransport,
      onChallenge: () => {
        $('pow-box').hidden = false;
        $('pow-progress').value = 0;
        $('queue-help').textContent = 'Checking your browser with a short computation…';
      },
      onPowProgress: (f) => {
        $('pow-progress').value = Math.round(f * 100);
      },
      onPowDone: () => {
        $('pow-progress').value = 100;
        $('pow-box').hidden = true;
        $('queue-help').textContent = 'Browser check done; joining…';
      },
    },
  });
  page.queue.start();
}

function stopQueue() {
  if (page.queue) page.queue.stop();
  page.queue = null;
}

function announce(text, force) {
  const now = performance.now();
  if (!force && now - page.lastAnnounce < 15000) return;
  page.lastAnnounce = now;
  $('queue-announce').textContent = text;
}

function onStatus(s) {
  const prev = page.queueState;
  page.queueState = s.state;
  if (Number.isFinite(s.opensAtMs)) page.opensAtMs = s.opensAtMs;
  const st = $('queue-state');
  st.textContent = s.state;
  st.dataset.state = s.state;
  const help = $('queue-help');
  const pos = Number(s.position);
  const changed = prev !== s.state;
  switch (s.state) {
    case 'PREQUEUE':
      $('position').textContent = '–';
      $('eta').textContent = 'from the opening';
      $('progress').value = 0;
      help.textContent = 'You are in. Places are drawn at random when the sale opens; keep this page open.';
      announce('You are in the queue. Places are drawn when the sale opens.', changed);
      break;
    case 'WAITING':
      if (Number.isFinite(pos)) {
        page.maxPosition = Math.max(page.maxPosition, pos);
        $('position').textContent = String(pos);
        $('progress').value = page.maxPosition > 0 ? Math.round(((page.maxPosition - pos) / page.maxPosition) * 100) : 0;
      }
      $('eta').textContent = formatEta(Number(s.etaSeconds));
      help.textContent = 'Keep this page open; your turn comes automatically.';
      announce(Number.isFinite(pos) ? pos + ' people ahead of you, ' + formatEta(Number(s.etaSeconds)) + '.' : 'Waiting.', changed);
      break;
    case 'ADMITTED':
      $('position').textContent = '0';
      $('eta').textContent = 'now';
      $('progress').value = 100;
      help.textContent = 'It is your turn. Choose an item below.';
      announce('It is your turn. You can buy now.', changed);
      break;
    case 'SOLD_OUT':
      $('eta').textContent = '–';
      help.textContent = 'Everything is sold out. Keep the page open: if reserved items are not paid they come back, in queue order.';
      announce('Sold out.', changed);
      break;
    case 'ENDED':
      $('eta').textContent = '–';
      help.textContent = 'The sale has ended.';
      announce('The sale has ended.', changed);
      break;
    default:
      break;
  }
  renderBanner();
  renderActions();
}

function onAdmitted(m) {
  const items = new Map();
  for (const it of m.items || []) {
    if (sameOrigin(it.purchaseUrl)) items.set(String(it.id), it.purchaseUrl);
  }
  page.admission = { token: m.admissionToken, expiresAtMs: Number(m.expiresAtMs), items };
  if (page.queueState !== 'SOLD_OUT') onStatus({ state: 'ADMITTED' });
  renderItems();
}

// sameOrigin accepts only purchase URLs on this site, so the access token is
// never sent anywhere else.
function sameOrigin(url) {
  if (typeof url !== 'string' || url === '') return false;
  try {
    return new URL(url, location.origin).origin === location.origin;
  } catch {
    return false;
  }
}

function onQueueError(code, message, fatal) {
  showError(code, message);
  if (code === 'UNAUTHENTICATED') setToken('');
  if (fatal) {
    $('queue-state').textContent = 'not joined';
    $('queue-state').dataset.state = 'ERROR';
    $('join').hidden = !page.token || code === 'BLOCKED' || code === 'NOT_FOUND';
  }
}

function onTransport(name, detail, delayMs) {
  let text = '';
  if (name === 'websocket') {
    text = detail === 'open' ? 'Live connection' : detail === 'reconnecting' ? 'Reconnecting in ' + Math.ceil(delayMs / 1000) + ' s…' : 'Connecting…';
  } else if (name === 'polling') {
    text = detail === 'retrying' ? 'Checking again in ' + Math.ceil(delayMs / 1000) + ' s…' : 'Checking for updates every 1–2 s';
  }
  const el = $('transport');
  el.dataset.transport = name;
  el.textContent = text;
  if (detail === 'open' || detail === 'forced' || detail === 'websocket failed') showError('');
}

// ---------- buying ----------

async function buy(itemId) {
  if (page.busy || !page.admission) return;
  const url = page.admission.items.get(itemId);
  if (!url) return;
  page.busy = true;
  renderActions();
  setResult('PENDING', 'Reserving…');
  const res = await buyWithRecovery({
    request,
    url,
    token: page.token,
    admissionToken: page.admission.token,
    orderUrl: saleOrderUrl(),
    sleep,
    onRetry: (r, waitMs) => {
      const why = r.networkError ? 'The connection dropped' : 'The shop could not answer';
      setResult('CHECKING', why + '; checking whether your order went through in ' + Math.ceil(waitMs / 1000) + ' s…');
    },
  });
  page.busy = false;
  if (res.kind !== 'answer') {
    showFound(res);
    renderActions();
    return;
  }
  const r = res.r;
  const body = r.body || {};
  if (r.status === 202 && body.orderId) {
    setResult('RESERVED', 'Reserved! Order ' + body.orderId + '.');
    // The 202 says PENDING; the order cannot be payable before the order
    // writer has stored it, so the first look is a second later.
    showOrder(body.orderId, body, 1000);
  } else {
    const code = r.error || 'HTTP_' + r.status;
    switch (code) {
      case 'ALREADY_PURCHASED':
        setResult(code, 'You already hold an order in this sale.');
        if (body.orderId) showOrder(body.orderId);
        else await lookupOrder();
        break;
      case 'SOLD_OUT':
        page.soldOut.add(itemId);
        setResult(code, 'Sorry, this item is sold out.');
        break;
      case 'NOT_ADMITTED':
        setResult(code, 'Your turn is no longer valid. Rejoining the queue…');
        page.admission = null;
        startQueue();
        break;
      case 'RATE_LIMITED':
      case 'UNAVAILABLE': {
        const wait = r.retryAfterMs || 2000;
        page.buyBlockedUntil = performance.now() + wait;
        const why = code === 'RATE_LIMITED' ? 'Too many attempts.' : 'The shop is busy; nothing was reserved.';
        setResult(code, why + ' Try again in ' + Math.ceil(wait / 1000) + ' s.');
        break;
      }
      case 'UNAUTHENTICATED':
        setResult(code, MESSAGES.UNAUTHENTICATED);
        setToken('');
        break;
      case 'BLOCKED':
        setResult(code, MESSAGES.BLOCKED);
        break;
      case 'NETWORK':
        setResult(code, 'The shop could not be reached and holds no order for you. Try again.');
        break;
      default:
        setResult(code, r.message || 'The purchase failed (' + code + ').');
    }
  }
  renderActions();
}

function setResult(code, text) {
  const el = $('result');
  el.dataset.result = code;
  el.textContent = text;
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

function saleOrderUrl() {
  return API + '/sales/' + encodeURIComponent(page.saleId) + '/order';
}

// showFound shows the outcome of an order lookup after a lost answer.
function showFound(found) {
  if (found.kind === 'order') {
    setResult('RESERVED', 'Your order went through: ' + found.order.orderId + '.');
    showOrder(found.order.orderId, found.order);
  } else if (found.kind === 'none') {
    setResult('NO_ORDER', 'No order was made. You can try again.');
  } else {
    setResult('UNKNOWN', 'Could not reach the shop to check your order. Reload the page to check again.');
  }
}

// lookupOrder finds the caller's order in this sale after a lost answer.
async function lookupOrder() {
  showFound(await findOrder({ request, orderUrl: saleOrderUrl(), token: page.token, sleep }));
}

// ---------- order ----------

const FINAL = new Set(['PAID', 'EXPIRED', 'CANCELLED', 'REJECTED']);

function showOrder(orderId, known, firstPollMs) {
  clearTimeout(page.orderTimer);
  page.order = { id: orderId, status: '', payable: false, expiresAtMs: NaN, itemId: '' };
  page.orderMisses = 0;
  $('order').hidden = false;
  $('order-id').textContent = orderId;
  if (known) renderOrder(known);
  if (firstPollMs) page.orderTimer = setTimeout(pollOrder, firstPollMs);
  else pollOrder();
}

async function pollOrder() {
  clearTimeout(page.orderTimer);
  const o = page.order;
  if (!o) return;
  const r = await request('GET', API + '/orders/' + encodeURIComponent(o.id), { token: page.token });
  if (page.order !== o) return;
  let delay = 1000;
  if (r.ok && r.body) {
    page.orderMisses = 0;
    renderOrder(r.body);
    if (FINAL.has(o.status)) return;
    delay = o.payable ? 5000 : 1000;
  } else if (r.status === 404) {
    // Just reserved: the order may take a moment to be visible.
    if (++page.orderMisses > 15) {
      $('order-help').textContent = 'This order cannot be found.';
      return;
    }
  } else {
    delay = r.retryAfterMs || 3000;
  }
  page.orderTimer = setTimeout(pollOrder, delay);
}

function renderOrder(body) {
  const o = page.order;
  o.status = body.status || o.status;
  o.payable = !!body.payable;
  if (body.itemId !== undefined) o.itemId = body.itemId;
  const exp = Date.parse(body.expiresAt);
  if (Number.isFinite(exp)) o.expiresAtMs = exp;
  const st = $('order-status');
  st.textContent = o.status;
  st.dataset.status = o.status;
  const pending = o.status === 'PENDING';
  $('pay').disabled = !(pending && o.payable);
  $('cancel').disabled = !pending;
  $('pay').hidden = !pending;
  $('cancel').hidden = !pending;
  const help = $('order-help');
  switch (o.status) {
    case 'PENDING':
      help.textContent = o.payable ? 'Reserved for you. Pay before the time runs out.' : 'Confirming your reservation…';
      break;
    case 'PAID':
      help.textContent = 'Paid. Thank you!';
      break;
    case 'EXPIRED':
      help.textContent = 'The payment time ran out; the item went back on sale.';
      break;
    case 'CANCELLED':
      help.textContent = 'Cancelled; the item went back on sale.';
      break;
    case 'REJECTED':
      help.textContent = 'The reservation could not be confirmed. Nothing was charged; you may try again.';
      break;
    default:
      help.textContent = '';
  }
  if (!pending) $('pay-deadline').textContent = '–';
  renderActions();
}

async function pay() {
  const o = page.order;
  if (!o) return;
  $('pay').disabled = true;
  for (let attempt = 0; attempt < 10; attempt++) {
    const r = await request('POST', API + '/orders/' + encodeURIComponent(o.id) + '/pay', { token: page.token, body: {} });
    if (r.ok) {
      setResult('PAID', 'Payment received.');
      break;
    }
    if (r.error === 'NOT_PAYABLE_YET' || r.networkError || r.status >= 500) {
      $('order-help').textContent = 'Still confirming; retrying the payment…';
      await new Promise((res) => setTimeout(res, r.retryAfterMs || 1000));
      continue;
    }
    setResult(r.error || 'HTTP_' + r.status, r.error === 'ORDER_EXPIRED' ? 'Too late: the payment time ran out.' : r.error === 'ORDER_CANCELLED' ? 'This order was cancelled.' : r.message || 'Payment failed.');
    break;
  }
  pollOrder();
}

async function cancelOrder() {
  const o = page.order;
  if (!o) return;
  $('cancel').disabled = true;
  const r = await request('POST', API + '/orders/' + encodeURIComponent(o.id) + '/cancel', { token: page.token });
  if (r.ok) setResult('CANCELLED', 'Order cancelled.');
  else if (r.error === 'ORDER_PAID') setResult(r.error, 'This order is paid and cannot be cancelled.');
  else setResult(r.error || 'HTTP_' + r.status, r.message || 'Could not cancel; try again.');
  pollOrder();
}

// ---------- ticking ----------

function tick() {
  if (!$('sales-view').hidden) tickList();
  if ($('sale-view').hidden || !page.sale) return;
  const st = saleState();
  const label = $('countdown-label');
  const cd = $('countdown');
  const left = page.clock.synced ? page.clock.until(page.opensAtMs) : NaN;
  let text;
  if (st === 'SOLD_OUT') {
    label.textContent = 'Status';
    text = 'Sold out';
  } else if (st === 'ENDED') {
    label.textContent = 'Status';
    text = 'Ended';
  } else if (!page.clock.synced) {
    label.textContent = 'Opens in';
    text = '--:--:--';
  } else if (left > 0) {
    label.textContent = 'Opens in';
    text = formatCountdown(left);
  } else {
    label.textContent = 'Status';
    text = 'Open now';
  }
  if (cd.textContent !== text) cd.textContent = text;
  cd.dataset.remainingMs = Number.isFinite(left) ? String(Math.max(0, Math.round(left))) : '';

  const adm = $('admission-expiry');
  if (page.order && page.order.status === 'PAID') {
    adm.textContent = '';
  } else if (page.admission && page.clock.synced && Number.isFinite(page.admission.expiresAtMs)) {
    const l = page.clock.until(page.admission.expiresAtMs);
    adm.textContent = l > 0 ? 'Your turn lasts ' + formatCountdown(l) + ' more.' : 'Your turn has ended.';
    if (l <= 0 && !page.order) {
      page.admission = null;
      renderActions();
    }
  } else if (!page.admission) {
    adm.textContent = '';
  }
  if (page.buyBlockedUntil > 0) {
    if (performance.now() >= page.buyBlockedUntil) page.buyBlockedUntil = 0;
    renderActions();
  }

  const o = page.order;
  if (o && o.status === 'PENDING' && Number.isFinite(o.expiresAtMs) && page.clock.synced) {
    $('pay-deadline').textContent = formatCountdown(page.clock.until(o.expiresAtMs));
  }
}

// ---------- start ----------

async function init() {
  page.token = acquireToken(TOKEN_KEY);
  if (!page.token && typeof window.FLASHSALE_TOKEN !== 'undefined') showError('TOKEN_SHAPE', 'The shop passed an access token that is not valid.');
  renderSignin();
  wireSignin();
  $('join').addEventListener('click', startQueue);
  $('pay').addEventListener('click', pay);
  $('cancel').addEventListener('click', cancelOrder);
  setInterval(tick, 250);

  const m = location.pathname.match(/^\/sales\/(\d+)\/?$/);
  if (!m) {
    showList();
    return;
  }
  page.saleId = m[1];
  $('sale-view').hidden = false;
  if (!(await loadSale())) return;
  scheduleSaleRefresh();
  if (page.token && page.sale.state !== 'ENDED') startQueue();
  tick();
}

init();
