// Waiting-room client: WebSocket first, HTTP polling as the fallback, proof
// of work when challenged, reconnects with exponential backoff and jitter.
// Everything it touches from the browser is injected, so node can test it.
import { Backoff } from './backoff.js';
import { powAnswer, solveAsync } from './pow.js';

// Errors after which reconnecting cannot help: the page must change
// something (sign in again) or give up.
// The access rule's refusals are fatal too: the shopper enters a code, or
// comes back at the time the message gives, and joins again by hand.
export const FATAL_ERRORS = new Set(['UNAUTHENTICATED', 'FORBIDDEN', 'BLOCKED', 'NOT_FOUND', 'INVALID', 'TOO_LARGE', 'DUPLICATE_IDENTITY',
  'NOT_INVITED', 'CODE_INVALID', 'CODE_USED', 'NOT_YET']);

// WebSocket connects that never opened before the page switches to polling.
export const FAILED_CONNECTS_BEFORE_POLLING = 2;

// queueUrls builds the queue endpoint for a sale from the page location.
export function queueUrls(loc, saleId) {
  const path = '/api/flash-sales/sales/' + encodeURIComponent(saleId) + '/queue';
  const ws = (loc.protocol === 'https:' ? 'wss://' : 'ws://') + loc.host + path;
  return { ws, http: path };
}

// challengeIn returns the challenge carried by a message or HTTP body, if any.
export function challengeIn(body) {
  if (!body || typeof body !== 'object') return null;
  if (body.type === 'challenge') return body;
  if (body.challenge && typeof body.challenge === 'object') return body.challenge;
  return null;
}

// startPowSolver solves a challenge in a Web Worker, or on the main thread
// in small slices when no module worker can be started. It returns
// {promise, cancel}; the promise resolves to the nonce.
export function startPowSolver(challenge, onProgress) {
  let worker = null;
  const ctrl = new AbortController();
  const promise = new Promise((resolve, reject) => {
    const fallback = () => {
      if (worker) worker.terminate();
      worker = null;
      solveAsync(challenge, { onProgress: (tried, f) => onProgress(f), signal: ctrl.signal }).then(resolve, reject);
    };
    try {
      worker = new Worker(new URL('./pow-worker.js', import.meta.url), { type: 'module' });
    } catch {
      fallback();
      return;
    }
    worker.onmessage = (ev) => {
      const m = ev.data || {};
      if (m.type === 'progress') onProgress(m.fraction);
      else if (m.type === 'done') {
        worker.terminate();
        resolve(m.nonce);
      } else if (m.type === 'failed') {
        worker.terminate();
        reject(new Error(m.message));
      }
    };
    worker.onerror = (ev) => {
      if (ev && ev.preventDefault) ev.preventDefault();
      fallback();
    };
    worker.postMessage({ challenge });
  });
  return {
    promise,
    cancel() {
      ctrl.abort();
      if (worker) worker.terminate();
    },
  };
}

const noop = () => {};

export class QueueClient {
  // opts: saleId, token, transport ('auto' | 'polling'), location,
  // WebSocketImpl, request (api.js request), solvePow (startPowSolver),
  // serverNow () => ms, random, handlers {onStatus, onAdmitted, onError,
  // onTransport, onChallenge, onPowProgress, onPowDone, onMessage}.
  constructor(opts) {
    this.saleId = opts.saleId;
    this.token = opts.token;
    this.mode = opts.transport === 'polling' ? 'polling' : 'auto';
    this.urls = queueUrls(opts.location, opts.saleId);
    this.WS = opts.WebSocketImpl;
    this.request = opts.request;
    this.solvePow = opts.solvePow || startPowSolver;
    this.serverNow = opts.serverNow || (() => NaN);
    this.random = opts.random || Math.random;
    this.setTimeout = opts.setTimeout || ((f, ms) => setTimeout(f, ms));
    this.clearTimeout = opts.clearTimeout || ((t) => clearTimeout(t));
    const h = opts.handlers || {};
    this.h = {
      onStatus: h.onStatus || noop,
      onAdmitted: h.onAdmitted || noop,
      onError: h.onError || noop,
      onTransport: h.onTransport || noop,
      onChallenge: h.onChallenge || noop,
      onPowProgress: h.onPowProgress || noop,
      onPowDone: h.onPowDone || noop,
      onMessage: h.onMessage || noop,
      onChoiceRefused: h.onChoiceRefused || noop,
    };
    this.backoff = new Backoff({ random: this.random });
    this.transport = '';
    this.ws = null;
    this.timer = null;
    this.failedConnects = 0;
    this.pow = null;
    // The invitation code of a codes sale ('' none): sent with every
    // join; once redeemed the server binds it and ignores it.
    this.code = typeof opts.code === 'string' ? opts.code.trim() : '';
    this.solver = null;
    this.challenges = 0;
    this.admissionToken = '';
    this.rejoins = 0;
    this.stopped = false;
    this.fatal = false;
    this.choice = ''; // an item choice not sent yet
    this.wsJoined = false; // the WebSocket's join was answered
  }

  start() {
    if (this.mode === 'polling' || !this.WS) this.startPolling('forced');
    else this.connect();
  }

  stop() {
    this.stopped = true;
    this.clearTimeout(this.timer);
    if (this.solver) this.solver.cancel();
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      try {
        ws.close(1000, 'leaving');
      } catch {
        // already closed
      }
    }
  }

  later(fn, ms) {
    this.clearTimeout(this.timer);
    this.timer = this.setTimeout(() => {
      this.timer = null;
      if (!this.stopped) fn();
    }, ms);
  }

  // choose sends the item wanted at the shopper's turn (queue order): on
  // the WebSocket at once, when polling with the next status call. The
  // answer is a status with chosenItemId, or onChoiceRefused.
  choose(itemId) {
    this.choice = String(itemId);
    // Only after the join's first status: before it the server reads a
    // join (again, after a challenge), and a choose there is INVALID.
    if (this.transport === 'websocket' && this.ws && this.ws.readyState === 1 && this.wsJoined) {
      this.ws.send(JSON.stringify({ type: 'choose', itemId: Number(itemId) }));
      this.choice = '';
    }
  }

  joinMessage() {
    const msg = { type: 'join', accessToken: this.token };
    if (this.code) msg.code = this.code;
    if (this.pow) {
      const exp = Number(this.pow.expiresAtMs);
      const now = this.serverNow();
      if (Number.isFinite(exp) && Number.isFinite(now) && now > exp) this.pow = null;
      else msg.pow = this.pow;
    }
    return msg;
  }

  // --- WebSocket ---

  connect() {
    if (this.stopped) return;
    this.transport = 'websocket';
    this.wsJoined = false;
    this.h.onTransport('websocket', 'connecting');
    let ws;
    try {
      ws = new this.WS(this.urls.ws);
    } catch {
      this.onConnectFailed();
      return;
    }
    this.ws = ws;
    let opened = false;
    const openTimer = this.setTimeout(() => {
      if (!opened) ws.close();
    }, 10000);
    ws.onopen = () => {
      opened = true;
      this.clearTimeout(openTimer);
      this.failedConnects = 0;
      this.h.onTransport('websocket', 'open');
      ws.send(JSON.stringify(this.joinMessage()));
    };
    ws.onmessage = (ev) => {
      let msg = null;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (this.ws === ws) this.handleMessage(msg, ws);
    };
    ws.onclose = () => {
      this.clearTimeout(openTimer);
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.stopped || this.fatal) return;
      if (!opened) {
        this.onConnectFailed();
        return;
      }
      if (this.solver) return; // reconnects with the answer when it is ready
      this.scheduleReconnect();
    };
    ws.onerror = noop; // a close event always follows
  }

  onConnectFailed() {
    this.failedConnects++;
    if (this.failedConnects >= FAILED_CONNECTS_BEFORE_POLLING) {
      this.startPolling('websocket failed');
      return;
    }
    this.scheduleReconnect();
  }

  scheduleReconnect() {
    const delay = this.backoff.next();
    this.h.onTransport(this.transport, 'reconnecting', delay);
    this.later(() => this.connect(), delay);
  }

  handleMessage(msg, ws) {
    switch (msg.type) {
      case 'challenge':
        this.handleChallenge(msg, () => {
          if (this.ws === ws && ws.readyState === 1) ws.send(JSON.stringify(this.joinMessage()));
          else if (!this.ws) this.connect();
        });
        break;
      case 'status':
        this.onStatus(msg);
        break;
      case 'admitted':
        this.onAdmitted(msg);
        break;
      case 'message':
        this.h.onMessage(msg);
        break;
      case 'choiceRefused':
        this.h.onChoiceRefused(String(msg.error || 'ERROR'), msg.message || '');
        break;
      case 'error':
        this.onServerError(msg.error, msg.message);
        break;
      default:
        break;
    }
  }

  onStatus(msg) {
    if (this.transport === 'websocket') this.wsJoined = true;
    if (this.choice && this.transport === 'websocket' && this.ws && this.ws.readyState === 1) {
      // A choice made before the connection was joined.
      const item = this.choice;
      this.choice = '';
      this.ws.send(JSON.stringify({ type: 'choose', itemId: Number(item) }));
    }
    this.backoff.reset();
    this.challenges = 0;
    this.h.onStatus(msg);
    if (msg.state === 'ENDED') this.stop();
  }

  onAdmitted(msg) {
    this.backoff.reset();
    this.admissionToken = msg.admissionToken;
    this.h.onAdmitted(msg);
  }

  onServerError(code, message) {
    const c = String(code || 'ERROR');
    const fatal = FATAL_ERRORS.has(c);
    if (fatal) this.fatal = true;
    this.h.onError(c, message || '', fatal);
    if (fatal) this.stop();
  }

  handleChallenge(challenge, resume) {
    if (this.solver) this.solver.cancel();
    this.challenges++;
    if (this.challenges > 5) {
      this.solver = null;
      this.onServerError('POW_REJECTED', 'The browser check kept failing.');
      return;
    }
    this.pow = null;
    this.h.onChallenge(challenge);
    const solver = this.solvePow(challenge, (f) => this.h.onPowProgress(f));
    this.solver = solver;
    solver.promise.then(
      (nonce) => {
        if (this.solver !== solver || this.stopped) return;
        this.solver = null;
        this.pow = powAnswer(challenge, nonce);
        this.h.onPowDone();
        resume();
      },
      (err) => {
        if (this.solver !== solver || this.stopped) return;
        this.solver = null;
        this.h.onError('POW_FAILED', String((err && err.message) || err), false);
        this.later(resume, this.backoff.next());
      },
    );
  }

  // --- polling ---

  startPolling(reason) {
    if (this.stopped) return;
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      try {
        ws.close();
      } catch {
        // ignore
      }
    }
    this.transport = 'polling';
    this.backoff.reset();
    this.h.onTransport('polling', reason);
    this.pollJoin();
  }

  pollDelay() {
    return 1000 + Math.round(this.random() * 1000);
  }

  async pollJoin() {
    const msg = this.joinMessage();
    const body = {};
    if (msg.pow) body.pow = msg.pow;
    if (msg.code) body.code = msg.code;
    const r = await this.request('POST', this.urls.http, { token: this.token, body: Object.keys(body).length ? body : undefined });
    if (this.stopped) return;
    if (this.httpProblem(r, () => this.pollJoin())) return;
    if (this.pollBody(r.body, () => this.pollJoin())) return;
    this.later(() => this.poll(), this.pollDelay());
  }

  async poll() {
    // A choice goes with the status call (?itemId=N); one refused is
    // reported and not sent again.
    const item = this.choice;
    this.choice = '';
    const url = item ? this.urls.http + (this.urls.http.includes('?') ? '&' : '?') + 'itemId=' + encodeURIComponent(item) : this.urls.http;
    const r = await this.request('GET', url, { token: this.token });
    if (this.stopped) return;
    if (item && !r.ok && (r.status === 400 || r.status === 409)) {
      this.h.onChoiceRefused(r.error || 'HTTP_' + r.status, r.message || '');
      this.later(() => this.poll(), this.pollDelay());
      return;
    }
    if (r.status === 404 && this.rejoins < 3) {
      // The place may be gone (for example after a long disconnect): join again.
      this.rejoins++;
      this.pollJoin();
      return;
    }
    if (this.httpProblem(r, () => this.poll())) return;
    this.rejoins = 0;
    if (this.pollBody(r.body, () => this.pollJoin())) return;
    this.later(() => this.poll(), this.pollDelay());
  }

  // pollBody handles a status object; true when it started something else.
  pollBody(body, rejoin) {
    const ch = challengeIn(body);
    if (ch) {
      this.handleChallenge(ch, rejoin);
      return true;
    }
    if (!body || typeof body !== 'object') return false;
    if (body.state) this.onStatus({ type: 'status', ...body });
    if (body.message && typeof body.message === 'object') this.h.onMessage({ type: 'message', ...body.message });
    if (body.admissionToken && body.admissionToken !== this.admissionToken) {
      this.onAdmitted({ type: 'admitted', admissionToken: body.admissionToken, expiresAtMs: body.expiresAtMs, notBeforeMs: body.notBeforeMs,
        holdUntilMs: body.holdUntilMs, heldItemId: body.heldItemId, items: body.items || [] });
    }
    return this.stopped;
  }

  // httpProblem handles a failed answer; true when it did (retry scheduled
  // or fatal error reported).
  httpProblem(r, retry) {
    if (r.ok) return false;
    const ch = challengeIn(r.body);
    if (ch) {
      this.handleChallenge(ch, () => this.pollJoin());
      return true;
    }
    if (r.networkError || r.status === 429 || r.status >= 500) {
      const delay = r.retryAfterMs || this.backoff.next();
      this.h.onTransport('polling', 'retrying', delay);
      this.later(retry, delay);
      return true;
    }
    const code = r.error || 'HTTP_' + r.status;
    if (FATAL_ERRORS.has(code) || r.status === 401 || r.status === 403 || r.status === 404) {
      this.onServerError(code, r.message);
      return true;
    }
    this.h.onError(code, r.message, false);
    this.later(retry, this.backoff.next());
    return true;
  }
}
