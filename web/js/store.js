// Chats kept in this browser: IndexedDB, one record per chat; in memory only when the
// browser refuses storage (the page says so). A chat: {id, sid (the server's session id),
// title, created, updated (ms), messages: [{role, content, error?, note?, stats?, pending?}]}.
import { newId, validSessionId } from './api.js';

const DB_NAME = 'appliance-chat';
const STORE = 'chats';
const LEGACY_KEY = 'chat.conversation.v1'; // the single conversation of the page before chats

function req(r) {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

function open() {
  return new Promise((resolve, reject) => {
    let r;
    try { r = indexedDB.open(DB_NAME, 1); } catch (e) { reject(e); return; }
    r.onupgradeneeded = () => r.result.createObjectStore(STORE, { keyPath: 'id' });
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.onblocked = () => reject(new Error('blocked'));
  });
}

class IdbStore {
  constructor(db) { this.db = db; this.persistent = true; }
  tx(mode) { return this.db.transaction(STORE, mode).objectStore(STORE); }
  async all() { return req(this.tx('readonly').getAll()); }
  async put(chat) { await req(this.tx('readwrite').put(chat)); }
  async del(id) { await req(this.tx('readwrite').delete(id)); }
}

class MemoryStore {
  constructor() { this.map = new Map(); this.persistent = false; }
  async all() { return [...this.map.values()].map((c) => structuredClone(c)); }
  async put(chat) { this.map.set(chat.id, structuredClone(chat)); }
  async del(id) { this.map.delete(id); }
}

export function titleFrom(text) {
  const line = String(text || '').trim().split('\n')[0].trim();
  return (line.length > 60 ? `${line.slice(0, 57)}…` : line) || 'New chat';
}

export function newChat() {
  const now = Date.now();
  return { id: newId(), sid: newId(), title: 'New chat', created: now, updated: now, messages: [] };
}

// A saved message that was still streaming when the page went away is marked interrupted,
// so a cut answer is never passed off as complete.
export function settle(chat) {
  for (const m of chat.messages) {
    m.content = String(m.content || '');
    if (m.role === 'assistant' && (m.pending || (!m.content && !m.error && !m.note))) m.note = 'interrupted';
    delete m.pending;
  }
  return chat;
}

// The page before chats kept one conversation in localStorage: carried over once, with
// its session id, so its server-side cache keeps working.
async function migrateLegacy(store) {
  let old;
  try { old = JSON.parse(localStorage.getItem(LEGACY_KEY)); } catch { return; }
  if (!old || !Array.isArray(old.messages)) return;
  const messages = old.messages
    .filter((m) => m && (m.role === 'user' || m.role === 'assistant'))
    .map((m) => {
      const out = { role: m.role, content: String(m.content || '') };
      for (const k of ['error', 'note', 'stats']) if (typeof m[k] === 'string') out[k] = m[k];
      if (m.pending) out.pending = true;
      return out;
    });
  if (messages.length) {
    const chat = newChat();
    if (validSessionId(old.id)) chat.sid = old.id;
    chat.messages = messages;
    chat.title = titleFrom((messages.find((m) => m.role === 'user') || {}).content);
    await store.put(settle(chat));
    store.migrated = chat.id;
  }
  try { localStorage.removeItem(LEGACY_KEY); } catch { /* stays; migrated again next time */ }
}

export async function openStore() {
  let store;
  try {
    store = new IdbStore(await open());
    await store.all();
  } catch {
    store = new MemoryStore();
  }
  try { await migrateLegacy(store); } catch { /* keep the old key for the next load */ }
  return store;
}
