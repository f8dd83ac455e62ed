// The server's state in the header; once ready, the model, its context and the presets.
import { apiFetch } from './api.js';
import { updateControls } from './messages.js';
import { els, page } from './page.js';
import { askKey, setPresets } from './settings.js';

const STATUS_TEXT = { ok: 'ready', loading: 'loading the model…', draining: 'restarting…', offline: 'offline' };
let healthTimer = 0;
export async function checkHealth() {
  clearTimeout(healthTimer);
  let state = 'offline', detail = '';
  try {
    const res = await fetch('health', { cache: 'no-store' });
    const j = await res.json().catch(() => ({}));
    state = res.ok ? 'ok' : (j.status || `error ${res.status}`);
    if (res.ok && j.slots && j.slots.busy) {
      detail = ` · ${j.slots.busy} of ${j.slots.total} busy${j.queue ? `, ${j.queue} waiting` : ''}`;
    }
  } catch { /* unreachable */ }
  const was = page.healthy;
  page.healthy = state === 'ok';
  const text = (STATUS_TEXT[state] || state) + detail;
  if (els.statusText.textContent !== text) els.statusText.textContent = text;
  els.statusDot.className = `dot ${page.healthy ? 'ok' : state === 'offline' ? 'down' : ''}`;
  if (page.healthy && (!was || !page.modelId)) loadServerInfo();
  updateControls();
  healthTimer = setTimeout(checkHealth, page.healthy ? 15000 : 3000);
}

let infoLoading = false;
async function loadServerInfo() {
  if (infoLoading) return;
  infoLoading = true;
  try {
    let res = await apiFetch('v1/models');
    if (res.status === 401 && await askKey()) res = await apiFetch('v1/models');
    if (res.ok) {
      const j = await res.json();
      const id = j && j.data && j.data[0] && j.data[0].id;
      if (id) { page.modelId = id; els.chatTitle.title = `Model: ${id}`; }
      const m = (j && j.data && j.data[0]) || {};
      page.ctxLimit = m.max_model_len || (m.meta && m.meta.n_ctx) || 0;
    }
    const p = await apiFetch('v1/system_prompts');
    if (p.ok) {
      const j = await p.json();
      setPresets(j.data);
    }
  } catch { /* the page works without the model name and presets */ } finally {
    infoLoading = false;
  }
}
