// Shopper page: the list of sales at "/", one sale at "/sales/{id}".
// Every text it shows comes from the language catalogues (lang.js); what
// it wrote is kept as keys, so a change of language re-renders it.
import { request } from './api.js';
import { acquireToken, clearToken, decodeClaims, expiresInMs, looksLikeJWT, saveToken } from './auth.js';
import { ServerClock } from './clock.js';
import { setupLanguage } from './lang.js';
import { buyWithRecovery, findOrder } from './buying.js';
import { QueueClient, startPowSolver } from './queue.js';
import { fetchKey, pushSupported, subscribe } from './notify.js';

const TOKEN_KEY = 'flashsale.token';
const API = '/api/flash-sales';

const $ = (id) => document.getElementById(id);

// States the queue and the sale can be in, each with a label in the
// catalogues (state.<STATE>).
const STATES = new Set(['PREQUEUE', 'WAITING', 'ADMITTED', 'SOLD_OUT', 'ENDED', 'PAUSED', 'SCHEDULED', 'OPEN']);

let i18n = null;
const t = (key, params) => i18n.t(key, params);

const page = {
  token: '',
  claims: null,
  clock: new ServerClock(),
  saleId: '',
  sale: null,
  opensAtMs: NaN,
  queue: null,
  queueState: '',
  lastStatus: null,
  maxPosition: 0,
  lastAnnounce: 0,
  admission: null, // {token, expiresAtMs, notBeforeMs (0: none), items: Map itemId → purchaseUrl}
  openingTimer: null, // turns the buy buttons on at the admission's notBeforeMs
  soldOut: new Set(),
  buyBlockedUntil: 0, // performance.now() until which buying waits (rate limit)
  busy: false,
  order: null, // {id, status, payable, expiresAtMs, itemId, paymentUrl}
  orderBody: null,
  orderTimer: null,
  orderMisses: 0,
  error: null, // {code, message}
  result: null, // {code, key, params}
  orderHelp: null, // {key, params}
  transport: null, // [name, detail, delayMs]
  message: null, // {text, atMs}
  powHelp: '',
  // Item choice (queue order): the server's word (chosenItemId), a choice
  // sent and not yet confirmed, whether the chosen item is sold out now,
  // and the code of the last refused choice.
  chosen: '',
  choicePending: '',
  chosenSoldOut: false,
  choiceRefused: '',
  // Turn notification: the VAPID key ('' while unknown or off), the
  // catalogue key of the outcome shown, and a subscribe in flight.
  pushKey: '',
  notify: '',
  notifyBusy: false,
};

// ---------- errors and sign-in ----------

// errorText is the text for an error code: the catalogue's, else the
// server's message (English, safe to show), else a generic one.
function errorText(code, message) {
  // NOT_YET says when: for a shopper of a tier, the tier's start as the
  // server names it ("too early: tier 2 may join from <RFC 3339>"), else
  // the public start of the sale's access rule.
  const tierAt = code === 'NOT_YET' && /tier (\d) may join from (\S+)/.exec(message || '');
  if (tierAt && !Number.isNaN(Date.parse(tierAt[2]))) return t('error.NOT_YET_TIER_AT', { tier: tierAt[1], at: i18n.dateTime(Date.parse(tierAt[2])) });
  const pub = page.sale && page.sale.access && page.sale.access.publicFrom;
  if (code === 'NOT_YET' && pub && !(message || '').includes('tier')) return t('error.NOT_YET_AT', { at: i18n.dateTime(Date.parse(pub)) });
  if (code === 'NOT_YET') return t('error.NOT_YET');
  if (i18n.has('error.' + code)) return t('error.' + code);
  return message || t('error.generic', { code });
}

function showError(code, message) {
  page.error = code ? { code, message } : null;
  renderError();
}

function renderError() {
  const el = $('error');
  if (!page.error) {
    el.textContent = '';
    el.removeAttribute('data-error');
    return;
  }
  el.dataset.error = page.error.code;
  el.textContent = errorText(page.error.code, page.error.message);
}

function renderSignin() {
  const signedIn = !!page.token;
  $('signin').hidden = signedIn;
  $('signout').hidden = !signedIn;
  page.claims = signedIn ? decodeClaims(page.token) : null;
  let who = page.claims && page.claims.sub ? t('signin.asUser', { user: page.claims.sub }) : signedIn ? t('signin.signedIn') : t('signin.notSignedIn');
  const now = page.clock.synced ? page.clock.now() : Date.now();
  if (signedIn && expiresInMs(page.claims, now) <= 0) who += ' ' + t('signin.expired');
  $('signed-in').textContent = who;
}

function setToken(token) {
  page.token = token;
  if (token) saveToken(TOKEN_KEY, token);
  else clearToken(TOKEN_KEY);
  renderSignin();
}

function setQueueState(state) {
  const st = $('queue-state');
  st.dataset.state = state;
  st.textContent = stateLabel(state);
}

function wireSignin() {
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const tok = $('token-input').value.trim();
    $('token-input').value = '';
    if (!looksLikeJWT(tok)) {
      showError('TOKEN_SHAPE');
      return;
    }
    showError('');
    setToken(tok);
    if (page.saleId) startQueue();
  });
  $('signout').addEventListener('click', () => {
    stopQueue();
    setToken('');
    setQueueState('');
  });
}

// stateLabel is the words for a state; '' (not joined) and ERROR read
// "not joined".
function stateLabel(state) {
  if (STATES.has(state)) return t('state.' + state);
  return t('state.none');
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
  document.title = t('shop.title');
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
    a.textContent = s.name || t('sale.numbered', { id: s.id });
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
    let text = listStateLabel(el.dataset.state);
    if (el.dataset.state === 'SCHEDULED' && Number.isFinite(left)) text = t('list.opensIn', { time: i18n.countdown(left) });
    el.textContent = '· ' + text;
  }
}

function listStateLabel(state) {
  const key = 'list.state.' + state;
  return i18n.has(key) ? t(key) : '';
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
  // Sold-out flags follow the latest word, the room's or the sale data's:
  // an item comes back when units return.
  for (const it of page.sale.items || []) {
    if (it.soldOut) page.soldOut.add(String(it.id));
    else page.soldOut.delete(String(it.id));
  }
  // The sale data may be a cached copy: it clears only a message that
  // came from the sale data, and never replaces a newer pushed one.
  if (page.sale.message && typeof page.sale.message === 'object') onMessage(page.sale.message, 'sale');
  else if (page.message && page.message.source === 'sale') onMessage({ text: '' }, 'sale');
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
  if (!s) return;
  const name = s.name || t('sale.numbered', { id: s.id });
  $('sale-name').textContent = name;
  document.title = t('shop.saleTitle', { name });
  const el = $('starts-at');
  el.dateTime = s.startsAt;
  el.textContent = i18n.dateTime(Date.parse(s.startsAt));
  renderItems();
  renderBanner();
  renderChoice();
  renderCode();
}

function saleState() {
  if (page.queueState === 'SOLD_OUT' || page.queueState === 'ENDED' || page.queueState === 'PAUSED') return page.queueState;
  const st = page.sale ? page.sale.state : '';
  // The room's live word wins over the sale data, a copy up to one
  // refresh old (a minute or more, and maybe cached): a room that says
  // WAITING or ADMITTED is not paused. Without this a sale resumed after
  // the page's last refresh kept its buy buttons off for that minute.
  if (st === 'PAUSED' && (page.queueState === 'WAITING' || page.queueState === 'ADMITTED')) return 'OPEN';
  return st;
}

function renderBanner() {
  const b = $('sale-banner');
  const st = saleState();
  b.dataset.state = st;
  const key = 'banner.' + st;
  b.textContent = i18n.has(key) ? t(key) : '';
}

// onMessage shows the operator's message to everyone in the sale ("" or
// no text clears it); the region is polite and atomic, so a screen reader
// reads each new message once, whole.
function onMessage(m, source = 'push') {
  const text = m && typeof m.text === 'string' ? m.text.trim() : '';
  const atMs = m ? Number(m.atMs) : NaN;
  const cur = page.message;
  if (cur && cur.text === text && (cur.atMs === atMs || !Number.isFinite(atMs))) return;
  if (cur && Number.isFinite(cur.atMs) && Number.isFinite(atMs) && atMs < cur.atMs) return;
  if (!cur && !text) return;
  page.message = text ? { text, atMs, source } : null;
  renderMessage();
}

function renderMessage() {
  const box = $('sale-message');
  const m = page.message;
  box.hidden = !m;
  $('sale-message-text').textContent = m ? m.text : '';
  const at = $('sale-message-at');
  if (m && Number.isFinite(m.atMs)) {
    at.dateTime = new Date(m.atMs).toISOString();
    at.textContent = '(' + i18n.time(m.atMs) + ')';
  } else {
    at.removeAttribute('datetime');
    at.textContent = '';
  }
}

// safeImage accepts the image URLs the contract allows: http(s) or a path
// on this site.
function safeImage(url) {
  if (typeof url !== 'string' || url === '') return '';
  if (url.startsWith('/') && !url.startsWith('//')) return url;
  try {
    const u = new URL(url);
    return u.protocol === 'https:' || u.protocol === 'http:' ? u.href : '';
  } catch {
    return '';
  }
}

function itemName(it) {
  return it.name || t('items.product', { id: it.productId });
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
      const img = document.createElement('img');
      img.className = 'item-image';
      img.width = 64;
      img.height = 64;
      img.decoding = 'async';
      const name = document.createElement('span');
      name.className = 'item-name';
      const price = document.createElement('span');
      price.className = 'price';
      const action = document.createElement('div');
      action.className = 'action';
      action.id = 'action-' + id;
      li.append(img, name, price, action);
      ul.append(li);
    }
    const name = itemName(it);
    li.querySelector('.item-name').textContent = name;
    li.querySelector('.price').textContent = i18n.price(it.priceCents, it.currency || 'USD');
    const img = li.querySelector('.item-image');
    const src = safeImage(it.imageUrl);
    li.classList.toggle('with-image', !!src);
    if (src) {
      if (img.getAttribute('src') !== src) img.src = src;
      img.alt = name;
      img.hidden = false;
    } else {
      img.removeAttribute('src');
      img.alt = '';
      img.hidden = true;
    }
  }
  if (page.admission) {
    for (const id of page.admission.items.keys()) {
      if (!seen.has(id) && !$('item-' + id)) {
        const li = document.createElement('li');
        li.id = 'item-' + id;
        li.className = 'item';
        const name = document.createElement('span');
        name.className = 'item-name';
        name.dataset.itemOnly = id;
        const action = document.createElement('div');
        action.className = 'action';
        action.id = 'action-' + id;
        li.append(name, document.createElement('span'), action);
        ul.append(li);
      }
    }
    for (const el of document.querySelectorAll('#items [data-item-only]')) el.textContent = t('items.item', { id: el.dataset.itemOnly });
  }
  renderActions();
}

// renderActions puts a buy button in each item's reserved action box once the
// shopper is admitted, and a short note otherwise (same height: no jump).
function renderActions() {
  const admitted = admissionValid();
  const ordering = page.order && (page.order.status === 'PENDING' || page.order.status === 'PAID' || !page.order.status);
  const waitMs = page.buyBlockedUntil - performance.now();
  const paused = saleState() === 'PAUSED';
  for (const box of document.querySelectorAll('#items .action')) {
    const id = box.id.slice('action-'.length);
    const url = page.admission && page.admission.items.get(id);
    if (page.order && page.order.status === 'PAID') {
      // One item per sale: after paying there is nothing more to buy.
      setNote(box, String(page.order.itemId) === id ? t('items.bought') : t('items.onePerSale'), '');
      continue;
    }
    const held = admitted && page.admission.held === id;
    if (page.soldOut.has(id) && !held) {
      setNote(box, t('items.soldOut'), 'soldout-' + id);
      continue;
    }
    if (paused) {
      setNote(box, t('items.paused'), '');
      continue;
    }
    if (!admitted || !url) {
      setNote(box, saleState() === 'ENDED' ? t('items.ended') : t('items.waitTurn'), '');
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
    const early = untilBuy() > 0;
    btn.disabled = page.busy || ordering || waitMs > 0 || early;
    btn.dataset.opensAt = early ? 'pending' : '';
    const text = early ? t('items.buyAtOpening') : waitMs > 0 ? t('items.buyWait', { s: i18n.seconds(waitMs) }) : t('items.buy');
    if (btn.textContent !== text) btn.textContent = text;
    // The button names its item for screen readers ("Buy" alone is one of
    // several identical buttons).
    const item = ((page.sale && page.sale.items) || []).find((x) => String(x.id) === id);
    const label = t('items.buyLabel', { name: item ? itemName(item) : t('items.item', { id }) });
    if (btn.getAttribute('aria-label') !== label) btn.setAttribute('aria-label', label);
  }
}

function setNote(box, text, id) {
  const first = box.firstElementChild;
  if (first && first.tagName === 'SPAN' && first.textContent === text && (first.id || '') === id) return;
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
    code: needsCode() ? $('invite-code').value : '',
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
      onMessage: (m) => onMessage(m),
      onChoiceRefused,
      onChallenge: () => {
        $('pow-box').hidden = false;
        $('pow-progress').value = 0;
        page.powHelp = 'pow.checking';
        $('queue-help').textContent = t(page.powHelp);
      },
      onPowProgress: (f) => {
        $('pow-progress').value = Math.round(f * 100);
      },
      onPowDone: () => {
        $('pow-progress').value = 100;
        $('pow-box').hidden = true;
        page.powHelp = 'pow.done';
        $('queue-help').textContent = t(page.powHelp);
      },
    },
  });
  page.queue.start();
  renderCode();
  offerNotify();
}

// ---------- turn notification (notify.js) ----------

async function offerNotify() {
  if (page.pushKey || !pushSupported(window)) return;
  page.pushKey = await fetchKey(request, API);
  renderNotify();
}

function renderNotify() {
  const waiting = !['ADMITTED', 'SOLD_OUT', 'ENDED'].includes(page.queueState);
  $('notify').hidden = !(page.pushKey && page.queue && waiting && page.notify !== 'notify.on');
  $('notify').disabled = page.notifyBusy;
  $('notify-note').textContent = page.notify ? t(page.notify) : '';
}

async function turnOnNotify() {
  if (page.notifyBusy || !page.pushKey) return;
  page.notifyBusy = true;
  renderNotify();
  const r = await subscribe({ win: window, request, api: API, saleId: page.saleId, token: page.token, key: page.pushKey });
  page.notifyBusy = false;
  page.notify = r.ok ? 'notify.on' : r.code === 'DENIED' || r.code === 'UNSUPPORTED' ? 'notify.' + r.code : 'notify.failed';
  renderNotify();
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

function onStatus(s, rerender = false) {
  const prev = page.queueState;
  page.queueState = s.state;
  page.lastStatus = s;
  if (s.type === 'status' && !rerender) onChoiceStatus(s);
  if (Array.isArray(s.soldOutItems)) {
    // The room's list of the items sold out now: an item answered
    // SOLD_OUT before is back when it is not in it.
    page.soldOut = new Set(s.soldOutItems.map(String));
    renderItems();
  }
  page.powHelp = '';
  if (Number.isFinite(s.opensAtMs)) page.opensAtMs = s.opensAtMs;
  setQueueState(s.state);
  if (prev === 'PAUSED' && s.state !== 'PAUSED' && !rerender) {
    // Resumed: the banner and buttons follow the room at once, and the
    // sale data (which said PAUSED) is read again.
    renderBanner();
    renderItems();
    loadSale();
  }
  renderNotify();
  const help = $('queue-help');
  const pos = Number(s.position);
  const changed = prev !== s.state && !rerender;
  const say = (text) => {
    if (!rerender) announce(text, changed);
  };
  switch (s.state) {
    case 'PREQUEUE':
      $('position').textContent = '–';
      $('eta').textContent = t('queue.fromOpening');
      $('progress').value = 0;
      help.textContent = t('help.PREQUEUE');
      say(t('announce.PREQUEUE'));
      break;
    case 'WAITING':
      if (Number.isFinite(pos)) {
        page.maxPosition = Math.max(page.maxPosition, pos);
        $('position').textContent = i18n.number(pos);
        $('progress').value = page.maxPosition > 0 ? Math.round(((page.maxPosition - pos) / page.maxPosition) * 100) : 0;
      }
      $('eta').textContent = i18n.eta(Number(s.etaSeconds));
      help.textContent = t('help.WAITING');
      say(Number.isFinite(pos) ? t('announce.ahead', { n: pos, eta: i18n.eta(Number(s.etaSeconds)) }) : t('announce.WAITING'));
      break;
    case 'ADMITTED':
      $('position').textContent = i18n.number(0);
      $('eta').textContent = t('queue.now');
      $('progress').value = 100;
      help.textContent = t('help.ADMITTED');
      say(t('announce.ADMITTED'));
      break;
    case 'PAUSED':
      // The place is kept: position and progress stay as they were.
      $('eta').textContent = t('queue.pausedEta');
      help.textContent = t('help.PAUSED');
      say(t('announce.PAUSED'));
      break;
    case 'SOLD_OUT':
      $('eta').textContent = '–';
      help.textContent = t('help.SOLD_OUT');
      say(t('announce.SOLD_OUT'));
      break;
    case 'ENDED':
      $('eta').textContent = '–';
      help.textContent = t('help.ENDED');
      say(t('announce.ENDED'));
      break;
    default:
      break;
  }
  renderBanner();
  renderActions();
  renderChoice();
}

// ---------- item choice (queue order) ----------

// choosing is whether the shopper may choose an item now: a sale allocated
// in queue order with more than one item (a one-item sale needs no
// choice), joined, and the turn not come.
function choosing() {
  const s = page.sale;
  if (!s || s.allocation !== 'queue' || !Array.isArray(s.items) || s.items.length < 2) return false;
  if (!page.queue || page.admission) return false;
  return ['PREQUEUE', 'WAITING', 'PAUSED', 'SOLD_OUT'].includes(page.queueState);
}

// onChoiceStatus takes the server's word on the choice from a status.
function onChoiceStatus(s) {
  const chosen = Number(s.chosenItemId) > 0 ? String(s.chosenItemId) : '';
  const wasOut = page.chosenSoldOut && page.chosen === chosen;
  page.chosen = chosen;
  page.chosenSoldOut = s.chosenSoldOut === true;
  if (page.choicePending === chosen) page.choicePending = '';
  if (page.chosenSoldOut && !wasOut && chosen) announce(t('choice.soldOut', { name: choiceName(chosen) }), true);
}

function onChoiceRefused(code) {
  page.choicePending = '';
  page.choiceRefused = code;
  renderChoice();
}

function choiceName(id) {
  const it = ((page.sale && page.sale.items) || []).find((x) => String(x.id) === id);
  return it ? itemName(it) : t('items.item', { id });
}

function pick(id) {
  if (!page.queue || id === (page.choicePending || page.chosen)) return;
  page.choicePending = id;
  page.choiceRefused = '';
  page.queue.choose(id);
  renderChoice();
}

// renderChoice shows the sale's items as radio buttons while the shopper
// waits, with the current choice and a note: what is chosen, that it is
// sold out (the place is kept), or why a choice was refused.
function renderChoice() {
  const box = $('choice');
  const show = choosing();
  box.hidden = !show;
  if (!show) return;
  const opts = $('choice-options');
  const current = page.choicePending || page.chosen;
  const items = page.sale.items;
  const ids = new Set(items.map((it) => String(it.id)));
  for (const el of [...opts.children]) if (!ids.has(el.dataset.item)) el.remove();
  for (const it of items) {
    const id = String(it.id);
    let row = opts.querySelector(`[data-item="${id}"]`);
    if (!row) {
      row = document.createElement('div');
      row.className = 'choice-option';
      row.dataset.item = id;
      const input = document.createElement('input');
      input.type = 'radio';
      input.name = 'choice';
      input.id = 'choice-' + id;
      input.value = id;
      input.dataset.testid = 'choice-' + id;
      input.addEventListener('change', () => {
        if (input.checked) pick(id);
      });
      const label = document.createElement('label');
      label.htmlFor = input.id;
      row.append(input, label);
      opts.append(row);
    }
    const input = row.querySelector('input');
    input.checked = current === id;
    const text = page.soldOut.has(id) ? t('choice.optionSoldOut', { name: itemName(it) }) : itemName(it);
    const label = row.querySelector('label');
    if (label.textContent !== text) label.textContent = text;
  }
  let note = '';
  if (page.choiceRefused) {
    const key = 'choice.refused.' + page.choiceRefused;
    note = i18n.has(key) ? t(key) : t('choice.refused.other', { code: page.choiceRefused });
  } else if (page.choicePending) {
    note = t('choice.sending', { name: choiceName(page.choicePending) });
  } else if (page.chosen && page.chosenSoldOut) {
    note = t('choice.soldOut', { name: choiceName(page.chosen) });
  } else if (page.chosen) {
    note = t('choice.chosen', { name: choiceName(page.chosen) });
  } else {
    note = t('choice.none');
  }
  const el = $('choice-note');
  el.dataset.soldOut = page.chosen && page.chosenSoldOut && !page.choicePending ? 'true' : '';
  if (el.textContent !== note) el.textContent = note;
}

function onAdmitted(m) {
  const items = new Map();
  for (const it of m.items || []) {
    if (sameOrigin(it.purchaseUrl)) items.set(String(it.id), it.purchaseUrl);
  }
  // A first-wave admission (made before the opening) buys from its
  // notBeforeMs, the opening instant by the server's clock.
  const nb = Number(m.notBeforeMs);
  // Queue order: one unit of heldItemId is held until holdUntilMs (the
  // token's expiry); it stays buyable whatever the sold-out list says
  // (every unit may be held).
  const held = Number(m.heldItemId) > 0 ? String(m.heldItemId) : '';
  page.admission = { token: m.admissionToken, expiresAtMs: Number(m.expiresAtMs), notBeforeMs: nb > 0 ? nb : 0, items, held };
  if (page.queueState !== 'SOLD_OUT' && page.queueState !== 'PAUSED') onStatus({ state: 'ADMITTED' });
  renderItems();
  armOpening();
}

// recheckSoldOut turns an item answered SOLD_OUT on again after a moment
// when the room still lists it as available: units came back between the
// room's look at the stock and the purchase (the answer is at most that
// stale), and the room says nothing new when its list did not change.
function recheckSoldOut(itemId) {
  setTimeout(() => {
    const st = page.lastStatus;
    if (!st || !Array.isArray(st.soldOutItems) || st.soldOutItems.map(String).includes(itemId)) return;
    if (page.queueState === 'SOLD_OUT' || !page.soldOut.delete(itemId)) return;
    renderItems();
  }, 1500 + Math.random() * 1000);
}

// untilBuy is how long until the admission buys (0: it does now). Before
// the clock is synced with the server a not-before counts as ahead.
function untilBuy() {
  const nb = page.admission ? page.admission.notBeforeMs : 0;
  if (!nb) return 0;
  if (!page.clock.synced) return Infinity;
  return Math.max(0, page.clock.until(nb));
}

// armOpening turns the buy buttons on at the admission's not-before, to the
// millisecond rather than at the next tick (which checks it too).
function armOpening() {
  clearTimeout(page.openingTimer);
  const left = untilBuy();
  if (left > 0 && Number.isFinite(left)) page.openingTimer = setTimeout(() => { renderActions(); armOpening(); }, left);
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
    setQueueState('ERROR');
    $('join').hidden = !page.token || code === 'BLOCKED' || code === 'NOT_FOUND' || code === 'DUPLICATE_IDENTITY';
    if (code === 'NOT_INVITED' || code === 'CODE_INVALID' || code === 'CODE_USED') {
      renderCode();
      $('invite-code').focus();
    }
  }
}

// needsCode: the sale's access rule asks for an invitation code.
function needsCode() {
  return !!(page.sale && page.sale.access && page.sale.access.rule === 'codes');
}

// renderCode shows the code field in a codes sale until the shopper is in
// the queue (a shopper who redeemed a code joins again without it).
function renderCode() {
  $('code-box').hidden = !needsCode() || !page.token || (!!page.queue && !page.queue.fatal);
}

function onTransport(name, detail, delayMs) {
  page.transport = [name, detail, delayMs];
  renderTransport();
  if (detail === 'open' || detail === 'forced' || detail === 'websocket failed') showError('');
}

function renderTransport() {
  if (!page.transport) return;
  const [name, detail, delayMs] = page.transport;
  let text = '';
  if (name === 'websocket') {
    text = detail === 'open' ? t('transport.live') : detail === 'reconnecting' ? t('transport.reconnecting', { s: i18n.seconds(delayMs) }) : t('transport.connecting');
  } else if (name === 'polling') {
    text = detail === 'retrying' ? t('transport.retrying', { s: i18n.seconds(delayMs) }) : t('transport.polling');
  }
  const el = $('transport');
  el.dataset.transport = name;
  el.textContent = text;
}

// ---------- buying ----------

async function buy(itemId) {
  if (page.busy || !page.admission || untilBuy() > 0) return;
  const url = page.admission.items.get(itemId);
  if (!url) return;
  page.busy = true;
  renderActions();
  setResult('PENDING', 'result.reserving');
  const res = await buyWithRecovery({
    request,
    url,
    token: page.token,
    admissionToken: page.admission.token,
    orderUrl: saleOrderUrl(),
    sleep,
    onRetry: (r, waitMs) => {
      setResult('CHECKING', r.networkError ? 'result.checkingDropped' : 'result.checkingFailed', { s: i18n.seconds(waitMs) });
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
    setResult('RESERVED', 'result.reserved', { id: body.orderId });
    // The 202 says PENDING; the order cannot be payable before the order
    // writer has stored it, so the first look is a second later.
    showOrder(body.orderId, body, 1000);
  } else {
    const code = r.error || 'HTTP_' + r.status;
    switch (code) {
      case 'ALREADY_PURCHASED':
        setResult(code, 'result.ALREADY_PURCHASED');
        if (body.orderId) showOrder(body.orderId);
        else await lookupOrder();
        break;
      case 'SOLD_OUT':
        page.soldOut.add(itemId);
        setResult(code, 'result.SOLD_OUT');
        recheckSoldOut(itemId);
        break;
      case 'SALE_PAUSED':
        // The admission stays valid for after the resume: keep it.
        setResult(code, 'result.SALE_PAUSED');
        onStatus({ ...(page.lastStatus || {}), state: 'PAUSED' });
        break;
      case 'NOT_ADMITTED':
        setResult(code, 'result.NOT_ADMITTED');
        page.admission = null;
        startQueue();
        break;
      case 'RATE_LIMITED':
      case 'UNAVAILABLE': {
        const wait = r.retryAfterMs || 2000;
        page.buyBlockedUntil = performance.now() + wait;
        setResult(code, 'result.' + code, { s: i18n.seconds(wait) });
        break;
      }
      case 'UNAUTHENTICATED':
        setResult(code, 'error.UNAUTHENTICATED');
        setToken('');
        break;
      case 'BLOCKED':
        setResult(code, 'error.BLOCKED');
        break;
      case 'NETWORK':
        setResult(code, 'result.NETWORK');
        break;
      default:
        setResult(code, i18n.has('error.' + code) ? 'error.' + code : 'result.failed', { code, message: r.message });
    }
  }
  renderActions();
}

// setResult shows the outcome of the shopper's last action; it keeps the
// key, so a change of language shows it again in the new language.
function setResult(code, key, params = {}) {
  page.result = code || key ? { code, key, params } : null;
  renderResult();
}

function renderResult() {
  const el = $('result');
  const r = page.result;
  if (!r || !r.code) el.removeAttribute('data-result');
  else el.dataset.result = r.code;
  el.textContent = r ? t(r.key, r.params) : t('result.none');
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

function saleOrderUrl() {
  return API + '/sales/' + encodeURIComponent(page.saleId) + '/order';
}

// showFound shows the outcome of an order lookup after a lost answer.
function showFound(found) {
  if (found.kind === 'order') {
    setResult('RESERVED', 'result.found', { id: found.order.orderId });
    showOrder(found.order.orderId, found.order);
  } else if (found.kind === 'none') {
    setResult('NO_ORDER', 'result.noOrder');
  } else {
    setResult('UNKNOWN', 'result.unknown');
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
  page.order = { id: orderId, status: '', payable: false, expiresAtMs: NaN, itemId: '', paymentUrl: '' };
  page.orderBody = null;
  page.orderHelp = null;
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
      setOrderHelp('orderHelp.notFound');
      return;
    }
  } else {
    delay = r.retryAfterMs || 3000;
  }
  page.orderTimer = setTimeout(pollOrder, delay);
}

// paymentPage is the shop's payment page for the order, when the shop has
// one (an http(s) URL the server filled in), else ''.
function paymentPage(url) {
  if (typeof url !== 'string' || url === '') return '';
  try {
    const u = new URL(url, location.origin);
    return u.protocol === 'https:' || u.protocol === 'http:' ? u.href : '';
  } catch {
    return '';
  }
}

function renderOrder(body) {
  const o = page.order;
  page.orderBody = body;
  o.status = body.status || o.status;
  o.payable = !!body.payable;
  if (body.itemId !== undefined) o.itemId = body.itemId;
  if (body.paymentUrl !== undefined) o.paymentUrl = paymentPage(body.paymentUrl);
  const exp = Date.parse(body.expiresAt);
  if (Number.isFinite(exp)) o.expiresAtMs = exp;
  const st = $('order-status');
  st.textContent = i18n.has('orderStatus.' + o.status) ? t('orderStatus.' + o.status) : o.status;
  st.dataset.status = o.status;
  const pending = o.status === 'PENDING';
  const pay = $('pay');
  pay.disabled = !(pending && o.payable);
  pay.dataset.paymentUrl = o.paymentUrl ? 'shop' : 'simulated';
  pay.textContent = o.paymentUrl ? t('order.payAtShop') : t('order.pay');
  $('cancel').disabled = !pending;
  pay.hidden = !pending;
  $('cancel').hidden = !pending;
  const help = 'orderHelp.' + (o.status === 'PENDING' ? (o.payable ? 'PENDING' : 'confirming') : o.status);
  setOrderHelp(i18n.has(help) ? help : '');
  if (!pending) $('pay-deadline').textContent = '–';
  renderActions();
}

function setOrderHelp(key, params = {}) {
  page.orderHelp = key ? { key, params } : null;
  $('order-help').textContent = key ? t(key, params) : '';
}

async function pay() {
  const o = page.order;
  if (!o) return;
  if (o.paymentUrl) {
    // The shop takes the payment on its own page and tells flashsale
    // server to server; the simulated pay is refused then.
    $('pay').disabled = true;
    setResult('REDIRECT', 'result.toShop');
    window.location.assign(o.paymentUrl);
    return;
  }
  $('pay').disabled = true;
  for (let attempt = 0; attempt < 10; attempt++) {
    const r = await request('POST', API + '/orders/' + encodeURIComponent(o.id) + '/pay', { token: page.token, body: {} });
    if (r.ok) {
      setResult('PAID', 'result.PAID');
      break;
    }
    if (r.error === 'NOT_PAYABLE_YET' || r.networkError || r.status >= 500) {
      setOrderHelp('orderHelp.retryingPay');
      await new Promise((res) => setTimeout(res, r.retryAfterMs || 1000));
      continue;
    }
    const code = r.error || 'HTTP_' + r.status;
    setResult(code, code === 'ORDER_EXPIRED' || code === 'ORDER_CANCELLED' ? 'result.' + code : 'result.payFailed', { message: r.message });
    break;
  }
  pollOrder();
}

async function cancelOrder() {
  const o = page.order;
  if (!o) return;
  $('cancel').disabled = true;
  const r = await request('POST', API + '/orders/' + encodeURIComponent(o.id) + '/cancel', { token: page.token });
  if (r.ok) setResult('CANCELLED', 'result.CANCELLED');
  else if (r.error === 'ORDER_PAID') setResult(r.error, 'result.ORDER_PAID');
  else setResult(r.error || 'HTTP_' + r.status, 'result.cancelFailed');
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
  let labelText = t('sale.status');
  let text;
  if (st === 'SOLD_OUT' || st === 'ENDED' || st === 'PAUSED') {
    text = t('countdown.' + st);
  } else if (!page.clock.synced) {
    labelText = t('sale.opensIn');
    text = '--:--:--';
  } else if (left > 0) {
    labelText = t('sale.opensIn');
    text = i18n.countdown(left);
  } else {
    text = t('countdown.OPEN');
  }
  if (label.textContent !== labelText) label.textContent = labelText;
  if (cd.textContent !== text) cd.textContent = text;
  cd.dataset.remainingMs = Number.isFinite(left) ? String(Math.max(0, Math.round(left))) : '';

  const adm = $('admission-expiry');
  let admText = '';
  if (page.order && page.order.status === 'PAID') {
    admText = '';
  } else if (page.admission && page.clock.synced && untilBuy() > 0) {
    const held = page.admission.held;
    admText = held
      ? t('items.heldStarts', { time: i18n.countdown(untilBuy()), window: i18n.countdown(page.admission.expiresAtMs - page.admission.notBeforeMs) })
      : t('items.turnStarts', { time: i18n.countdown(untilBuy()) });
  } else if (page.admission && page.clock.synced && Number.isFinite(page.admission.expiresAtMs)) {
    const l = page.clock.until(page.admission.expiresAtMs);
    admText = l > 0 ? t(page.admission.held ? 'items.heldLasts' : 'items.turnLasts', { time: i18n.countdown(l) }) : t('items.turnEnded');
    if (l <= 0 && !page.order) {
      page.admission = null;
      renderActions();
    }
  }
  if (adm.textContent !== admText) adm.textContent = admText;
  if (page.buyBlockedUntil > 0) {
    if (performance.now() >= page.buyBlockedUntil) page.buyBlockedUntil = 0;
    renderActions();
  }
  // The clock may sync after the admission came: arm the opening then, and
  // let a tick catch a not-before the timer missed.
  if (page.admission && page.admission.notBeforeMs) {
    const early = untilBuy() > 0;
    if (page.admission.early !== early) {
      page.admission.early = early;
      renderActions();
      armOpening();
    }
  }

  const o = page.order;
  if (o && o.status === 'PENDING' && Number.isFinite(o.expiresAtMs) && page.clock.synced) {
    $('pay-deadline').textContent = i18n.countdown(page.clock.until(o.expiresAtMs));
  }
}

// relabel shows everything the script wrote in the newly chosen language.
function relabel() {
  renderSignin();
  renderError();
  if (!$('sales-view').hidden) {
    document.title = t('shop.title');
    tickList();
  }
  renderSale();
  setQueueState($('queue-state').dataset.state || '');
  if (page.lastStatus) onStatus(page.lastStatus, true);
  renderChoice();
  renderNotify();
  if (page.powHelp) $('queue-help').textContent = t(page.powHelp);
  renderTransport();
  renderMessage();
  renderResult();
  if (page.order && page.orderBody) renderOrder(page.orderBody);
  if (page.orderHelp) setOrderHelp(page.orderHelp.key, page.orderHelp.params);
  tick();
}

// ---------- start ----------

async function init() {
  i18n = setupLanguage(document, window, relabel);
  page.token = acquireToken(TOKEN_KEY);
  if (!page.token && typeof window.FLASHSALE_TOKEN !== 'undefined') showError('TOKEN_PASSED');
  renderSignin();
  renderResult();
  setQueueState('');
  wireSignin();
  $('join').addEventListener('click', startQueue);
  $('invite-code').addEventListener('keydown', (e) => {
    if (e.key === 'Enter') startQueue();
  });
  $('notify').addEventListener('click', turnOnNotify);
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
