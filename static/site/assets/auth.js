// Access token handling for the pages. The token is never part of any file
// or URL the server sees: it arrives in the URL fragment (#token=<jwt>, which
// browsers never send), in sessionStorage (set by the shop's own same-origin
// sign-in), or in window.FLASHSALE_TOKEN (set by a shop that wraps the page).
// It is kept in sessionStorage only: per tab, gone when the tab closes.

// parseFragment splits a location.hash into the token and what remains.
export function parseFragment(hash) {
  const raw = String(hash || '').replace(/^#/, '');
  if (!raw) return { token: '', rest: '' };
  const params = new URLSearchParams(raw);
  const token = params.get('token') || '';
  params.delete('token');
  const rest = params.toString();
  return { token, rest: rest ? '#' + rest : '' };
}

// looksLikeJWT is a shape check only; the server verifies the signature.
export function looksLikeJWT(token) {
  return typeof token === 'string' && /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(token);
}

// decodeClaims reads the JWT payload for display (user id, role, expiry).
// It does not verify anything and must never be used to decide access.
export function decodeClaims(token) {
  if (!looksLikeJWT(token)) return null;
  try {
    const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    const bin = atob(part + '='.repeat((4 - (part.length % 4)) % 4));
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return claims && typeof claims === 'object' ? claims : null;
  } catch {
    return null;
  }
}

// expiresInMs is the time left on the token at nowMs (Infinity without exp).
export function expiresInMs(claims, nowMs) {
  if (!claims || typeof claims.exp !== 'number') return Infinity;
  return claims.exp * 1000 - nowMs;
}

// acquireToken finds the token for this tab and removes it from the address
// bar. storageKey separates the shopper's token from the operator's.
export function acquireToken(storageKey, win = globalThis) {
  const { token, rest } = parseFragment(win.location.hash);
  if (token) {
    const url = win.location.pathname + win.location.search + rest;
    win.history.replaceState(win.history.state, '', url);
    if (looksLikeJWT(token)) {
      saveToken(storageKey, token, win);
      return token;
    }
  }
  if (typeof win.FLASHSALE_TOKEN === 'string' && looksLikeJWT(win.FLASHSALE_TOKEN)) {
    saveToken(storageKey, win.FLASHSALE_TOKEN, win);
    return win.FLASHSALE_TOKEN;
  }
  try {
    const stored = win.sessionStorage.getItem(storageKey) || '';
    return looksLikeJWT(stored) ? stored : '';
  } catch {
    return '';
  }
}

export function saveToken(storageKey, token, win = globalThis) {
  try {
    win.sessionStorage.setItem(storageKey, token);
  } catch {
    // Storage disabled: the token lives only as long as the page.
  }
}

export function clearToken(storageKey, win = globalThis) {
  try {
    win.sessionStorage.removeItem(storageKey);
  } catch {
    // nothing stored
  }
}
