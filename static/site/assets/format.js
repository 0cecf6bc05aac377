// Text formatting shared by the pages.

const pad = (n) => String(n).padStart(2, '0');

// formatCountdown shows a duration as [Dd ]HH:MM:SS, rounding up so that
// 00:00:00 appears only when the moment has come.
export function formatCountdown(ms) {
  if (!Number.isFinite(ms)) return '--:--:--';
  const total = Math.max(0, Math.ceil(ms / 1000));
  const d = Math.floor(total / 86400);
  const h = Math.floor((total % 86400) / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  return (d > 0 ? d + 'd ' : '') + pad(h) + ':' + pad(m) + ':' + pad(s);
}

// formatEta shows a waiting estimate in words.
export function formatEta(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return 'unknown';
  if (seconds < 5) return 'a few seconds';
  if (seconds < 60) return 'about ' + Math.round(seconds) + ' s';
  if (seconds < 3600) {
    const m = Math.floor(seconds / 60);
    const s = Math.round(seconds % 60);
    return 'about ' + m + ' min' + (s ? ' ' + s + ' s' : '');
  }
  return 'about ' + Math.floor(seconds / 3600) + ' h ' + Math.round((seconds % 3600) / 60) + ' min';
}

// formatCents shows integer cents as a decimal amount.
export function formatCents(cents) {
  if (!Number.isFinite(cents)) return '';
  const sign = cents < 0 ? '-' : '';
  const abs = Math.abs(Math.trunc(cents));
  return sign + Math.floor(abs / 100) + '.' + pad(abs % 100);
}

// formatDateTime shows a Unix-millisecond instant in the reader's locale.
export function formatDateTime(ms) {
  if (!Number.isFinite(ms)) return '';
  return new Date(ms).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });
}
