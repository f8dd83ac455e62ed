// Chats kept on the box (people mode): the same interface as store.js's, over /v1/chats.
// The list comes without messages; a chat's messages are loaded when it is opened (load),
// and again whenever it is shown (refresh), as another device may have gone on with it.
// While an answer streams, its chat is saved at most every SAVE_EVERY_MS (the answer's end
// is always saved), and one save at a time per chat. Each save names the version it was
// read at (`base`): a chat changed since on another device is not overwritten (409), it is
// loaded again and the page says so.
import { apiFetch, readError } from './api.js';

const SAVE_EVERY_MS = 5000;
const ROLES = new Set(['user', 'assistant', 'system']);

function toServer(chat) {
  return {
    title: chat.title, base: chat.serverUpdated ?? null,
    meta: { sid: chat.sid, created: chat.created, ...(chat.library ? { library: true } : {}) },
    messages: chat.messages.filter((m) => ROLES.has(m.role)).map(({ role, content, ...meta }) => ({ role, content: String(content || ''), meta })),
  };
}

function fromServer(c) {
  const meta = c.meta || {};
  return {
    id: c.id, sid: typeof meta.sid === 'string' ? meta.sid : c.id, title: c.title,
    created: typeof meta.created === 'number' ? meta.created : Math.round(c.created * 1000),
    updated: Math.round(c.updated * 1000), shared: !!c.shared, serverUpdated: c.updated, library: !!meta.library,
    messages: (c.messages || []).map((m) => ({ ...(m.meta || {}), role: m.role, content: m.content })),
    stub: !c.messages,
  };
}

export class ServerStore {
  constructor(onTrouble, onChanged) {
    this.persistent = true;
    this.onTrouble = onTrouble; // (message or null): the page says whether chats are being saved
    this.onChanged = onChanged; // (chat): another device changed it; it was loaded again
    this.saving = new Map(); // chat id -> {busy, again, last}
  }

  async all() {
    const res = await apiFetch('v1/chats');
    if (!res.ok) throw new Error((await readError(res)).message);
    return (await res.json()).chats.map(fromServer);
  }

  async search(q) {
    const res = await apiFetch(`v1/chats?q=${encodeURIComponent(q)}`);
    if (!res.ok) throw new Error((await readError(res)).message);
    return (await res.json()).chats.map((c) => c.id);
  }

  async load(chat) {
    if (!chat.stub) return chat;
    return this.refresh(chat);
  }

  // The chat as the box has it now; true when that differs from what this page had.
  async refresh(chat) {
    const res = await apiFetch(`v1/chats/${encodeURIComponent(chat.id)}`);
    if (res.status === 404) return false; // not saved yet
    if (!res.ok) throw new Error((await readError(res)).message);
    const full = fromServer(await res.json());
    const changed = full.serverUpdated !== chat.serverUpdated;
    if (changed || chat.stub) {
      Object.assign(chat, { messages: full.messages, title: full.title, updated: full.updated,
        serverUpdated: full.serverUpdated, shared: full.shared, sid: full.sid, library: full.library });
    }
    chat.stub = false;
    return changed;
  }

  async put(chat) {
    if (chat.stub) return;
    const s = this.saving.get(chat.id) || { busy: false, again: false, last: 0 };
    this.saving.set(chat.id, s);
    const streaming = chat.messages.some((m) => m.pending);
    if (streaming && Date.now() - s.last < SAVE_EVERY_MS) return;
    if (s.busy) { s.again = true; return; }
    s.busy = true;
    try {
      do {
        s.again = false;
        s.last = Date.now();
        const res = await apiFetch(`v1/chats/${encodeURIComponent(chat.id)}`, {
          method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(toServer(chat)),
        });
        if (res.status === 409) { // changed on another device: theirs stands, this page catches up
          await this.refresh(chat);
          this.onChanged(chat);
          return;
        }
        if (!res.ok) {
          const err = await readError(res);
          this.onTrouble(err.status === 503 ? 'Chats are not being saved on the server right now.' : null);
          throw new Error(err.message);
        }
        chat.serverUpdated = (await res.json()).updated;
        this.onTrouble(null);
      } while (s.again);
    } finally {
      s.busy = false;
    }
  }

  async del(id) {
    const res = await apiFetch(`v1/chats/${encodeURIComponent(id)}`, { method: 'DELETE' });
    if (!res.ok && res.status !== 404) throw new Error((await readError(res)).message);
  }
}
