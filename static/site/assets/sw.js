// The service worker of the turn notifications (notify.js): it shows the
// notification the sale's leader pushes when the shopper's turn comes, in
// the browser's language, and opens the sale page on a click. The payload
// is {"type": "admitted", "saleId", "url"} (CONTRACT.md section 4).

const TEXT = {
  en: { title: 'It is your turn', body: 'Your turn in the sale has come. Open the page to buy.' },
  es: { title: 'Es tu turno', body: 'Ha llegado tu turno en la venta. Abre la página para comprar.' },
};

function text() {
  const lang = String((self.navigator && self.navigator.language) || 'en').toLowerCase();
  return lang.startsWith('es') ? TEXT.es : TEXT.en;
}

// saleUrl keeps the page's own origin: a payload names a path of it only.
function saleUrl(data) {
  const url = data && typeof data.url === 'string' && /^\/sales\/\d+$/.test(data.url) ? data.url : '/';
  return new URL(url, self.location.origin).href;
}

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('push', (event) => {
  let data = null;
  try {
    data = event.data ? event.data.json() : null;
  } catch {
    data = null;
  }
  if (!data || data.type !== 'admitted') return;
  const t = text();
  event.waitUntil(
    self.registration.showNotification(t.title, {
      body: t.body,
      tag: 'turn-' + String(data.saleId),
      requireInteraction: true,
      data: { url: saleUrl(data) },
    }),
  );
});

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const url = (event.notification.data && event.notification.data.url) || new URL('/', self.location.origin).href;
  event.waitUntil(
    (async () => {
      const wins = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
      for (const w of wins) {
        if (w.url === url && 'focus' in w) return w.focus();
      }
      return self.clients.openWindow(url);
    })(),
  );
});
