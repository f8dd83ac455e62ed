// Talking to the appliance: the API key, requests, errors in plain words, session ids.
// Paths are relative to the page, so the page also works under a reverse-proxy prefix.
const KEY_STORE = 'chat.apiKey';

export const apiKey = {
  get() { try { return localStorage.getItem(KEY_STORE) || ''; } catch { return ''; } },
  set(k) { try { localStorage.setItem(KEY_STORE, k); } catch { /* storage disabled: this page only */ } memoryKey = k; },
  clear() { try { localStorage.removeItem(KEY_STORE); } catch { /* nothing stored */ } memoryKey = ''; },
};
let memoryKey = '';
const currentKey = () => apiKey.get() || memoryKey;
// People mode: the session's CSRF token, sent with every request (the cookie signs in; a change
// without this header is refused, and a cross-site page cannot send it).
let csrf = '';
export const setCsrf = (t) => { csrf = t || ''; };

export function apiFetch(path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  const key = currentKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (csrf) headers['X-CSRF-Token'] = csrf;
  return fetch(path, { cache: 'no-store', ...opts, headers });
}

// Session ids: 16-128 characters of [A-Za-z0-9_-]. crypto.randomUUID exists only in secure
// contexts (https, localhost); the page is usually plain http on a LAN address.
export function newId() {
  if (typeof crypto.randomUUID === 'function') {
    try { return crypto.randomUUID(); } catch { /* fall through */ }
  }
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
export const validSessionId = (s) => typeof s === 'string' && /^[A-Za-z0-9_-]{16,128}$/.test(s);

// An error response as {status, message, type, code, retryAfter (s)}.
export async function readError(res) {
  const raw = await res.text().catch(() => '');
  let message = raw.trim().slice(0, 300), type = '', code = '';
  try {
    const e = JSON.parse(raw).error;
    if (typeof e === 'string') message = e;
    else if (e) { message = e.message || message; type = e.type || ''; code = e.code || ''; }
  } catch { /* not JSON */ }
  const ra = parseInt(res.headers.get('Retry-After') || '', 10);
  return { status: res.status, message, type, code, retryAfter: Number.isFinite(ra) && ra >= 0 ? ra : null };
}

// What went wrong, in words for the person at the keyboard.
export function plainWords(err) {
  const { status, message, code } = err;
  if (status === 400 && code === 'context_length_exceeded') {
    return 'This message is too long for the model. Shorten it, or start a new chat.';
  }
  if (status === 413) return 'This message is too long for the server. Shorten it, or split it up.';
  if (status === 401 && csrf) return 'Your sign-in has ended. Reload the page to sign in again.';
  if (status === 401) return 'This server needs an API key. Enter one under Settings.';
  if (status === 404) return 'The server did not find this conversation. Start a new chat to go on.';
  if (status === 429 && code === 'quota_exceeded' && message) return message;  // the quota and when it resets
  if (status === 429) return 'The server is busy.';
  if (status === 503) return 'The server is restarting or still loading the model. Try again in a moment.';
  if (status >= 500) return `The server failed (${status}).${message ? ' ' + message : ''}`;
  return message ? `${message} (${status})` : `The request failed (${status}).`;
}

// Waits ms, or rejects with an AbortError when the signal fires.
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal && signal.aborted) { reject(new DOMException('stopped', 'AbortError')); return; }
    const t = setTimeout(() => { signal && signal.removeEventListener('abort', stop); resolve(); }, ms);
    const stop = () => { clearTimeout(t); reject(new DOMException('stopped', 'AbortError')); };
    if (signal) signal.addEventListener('abort', stop, { once: true });
  });
}
