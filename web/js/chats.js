// Chats: the list (searched; a column on a desktop, a drawer on a phone) and the chat on
// screen, saved, new, renamed, deleted, exported, imported.
import { apiFetch } from './api.js';
import { fileName, parseImport, toJSON, toMarkdown } from './chatfile.js';
import { closeEdit, renderMessages, updateControls } from './messages.js';
import { askUser, download, el, els, narrow, page, say, toast } from './page.js';
import { peopleModule } from './people-load.js';
import { people } from './who.js';
import { newChat } from './store.js';

// On the box (people mode) a search looks through the chats' text too: the server's answer
// (ids matching, newest first) replaces the title filter once it comes.
let found = null; // {q, ids: Set} from GET v1/chats?q=
let searchTimer = 0;
function searchServer(q) {
  clearTimeout(searchTimer);
  if (!q || !page.store || !page.store.search) { found = null; return; }
  searchTimer = setTimeout(async () => {
    try {
      const ids = await page.store.search(q);
      if (els.search.value.trim().toLowerCase() === q) { found = { q, ids: new Set(ids) }; renderList(); }
    } catch { /* the title filter stays */ }
  }, 250);
}

export function renderList() {
  const q = els.search.value.trim().toLowerCase();
  const byServer = found && found.q === q ? found.ids : null;
  const shown = page.chats.filter((c) => !q || c.title.toLowerCase().includes(q) || (byServer && byServer.has(c.id)));
  els.chatList.replaceChildren(...shown.map((c) => {
    const li = el('li');
    const b = el('button', 'chat-item', c.title);
    b.type = 'button';
    b.dataset.id = c.id;
    b.title = c.title;
    if (page.current && c.id === page.current.id) b.setAttribute('aria-current', 'page');
    if (page.run && page.run.chat === c) b.classList.add('busy');
    li.append(b);
    return li;
  }));
  els.listEmpty.hidden = shown.length > 0;
  els.listEmpty.textContent = q ? (page.store && page.store.search ? 'No chat has that in it.' : 'No chat has that in its title.') : 'No chats yet.';
}
els.search.addEventListener('input', () => { renderList(); searchServer(els.search.value.trim().toLowerCase()); });

let sideHidden = false;
export function setDrawer(open) {
  if (!narrow.matches) return;
  els.app.classList.toggle('drawer-open', open);
  els.backdrop.hidden = !open;
  syncSide();
  if (open) els.search.focus();
}
export function syncSide() {
  const visible = narrow.matches ? els.app.classList.contains('drawer-open') : !sideHidden;
  els.app.classList.toggle('side-hidden', !narrow.matches && sideHidden);
  els.sidebar.inert = !visible;
  els.toggleSide.setAttribute('aria-expanded', String(visible));
  els.toggleSide.setAttribute('aria-label', visible ? 'Hide the chat list' : 'Show the chat list');
}
els.toggleSide.addEventListener('click', () => {
  if (narrow.matches) setDrawer(!els.app.classList.contains('drawer-open'));
  else { sideHidden = !sideHidden; syncSide(); }
});
els.closeSide.addEventListener('click', () => { setDrawer(false); els.toggleSide.focus(); });
els.backdrop.addEventListener('click', () => setDrawer(false));
narrow.addEventListener('change', () => { els.app.classList.remove('drawer-open'); els.backdrop.hidden = true; syncSide(); });

export const sortChats = () => page.chats.sort((a, b) => b.updated - a.updated);
els.chatList.addEventListener('click', (e) => {
  const b = e.target.closest('.chat-item');
  const chat = b && page.chats.find((c) => c.id === b.dataset.id);
  if (chat) show(chat);
});

// A chat is stored once listed (touch lists it at its first message).
export function save(chat) {
  if (!page.chats.includes(chat)) return Promise.resolve();
  return page.store.put(chat).catch((e) => toast(`Could not save this chat: ${e && e.message}`));
}
export function touch(chat) {
  chat.updated = Date.now();
  if (!page.chats.includes(chat)) page.chats.unshift(chat);
  sortChats();
  renderList();
}

export function show(chat) {
  if (page.current && page.current !== chat) closeEdit();
  page.current = chat;
  try { localStorage.setItem('chat.current', chat.id); } catch { /* reopen the newest */ }
  els.chatTitle.textContent = chat.title;
  document.title = `${chat.title} · Chat`;
  els.composer.hidden = !!chat.readOnly;
  els.readOnly.hidden = !chat.readOnly;
  els.library.checked = !!chat.library;
  for (const b of els.chatMenu.querySelectorAll('[data-people]')) {
    b.hidden = people.mode !== 'people' || !!chat.readOnly || (b.dataset.act === 'unshare' && !chat.shared);
  }
  renderMessages();
  renderList();
  setDrawer(false);
  updateControls();
  // Kept on the box: its messages come when it is opened, and again if another device went on.
  if (page.store.refresh && !chat.readOnly && !(page.run && page.run.chat === chat)) {
    const stub = chat.stub; // listed without its messages: they are drawn once they come
    page.store.refresh(chat).then((changed) => {
      if (page.current === chat && (changed || stub)) {
        els.chatTitle.textContent = chat.title;
        els.library.checked = !!chat.library;
        renderMessages();
        renderList();
      }
      if (page.current === chat) updateControls();
    }).catch((e) => toast(`Could not open this chat: ${e && e.message}`));
  }
}
export function startNewChat() {
  show(newChat());
  els.input.focus();
}
els.newChat.addEventListener('click', startNewChat);

// The chat actions menu (⋯): rename, export, delete.
els.chatMenu.addEventListener('click', async (e) => {
  const b = e.target.closest('button[data-act]');
  if (!b) return;
  els.chatMenu.open = false;
  const chat = page.current;
  const act = b.dataset.act;
  if (act === 'rename') {
    const t = await askUser({ title: 'Rename chat', value: chat.title, ok: 'Rename' });
    if (t && t.trim()) {
      chat.title = t.trim().slice(0, 200);
      if (page.chats.includes(chat)) { save(chat); } else touch(chat);
      if (page.current === chat) show(chat);
      renderList();
    }
  } else if (act === 'export-md') {
    download(fileName(chat, 'md'), 'text/markdown', toMarkdown(chat));
  } else if (act === 'export-json') {
    download(fileName(chat, 'json'), 'application/json', toJSON(chat));
  } else if (act === 'share') {
    if (!page.chats.includes(chat)) { toast('Send a message first: an empty chat has nothing to share.'); return; }
    await (await peopleModule()).shareChat(chat); // the chat as saved on the box (each turn is saved as it ends)
    show(chat);
  } else if (act === 'unshare') {
    await (await peopleModule()).unshareChat(chat);
    show(chat);
  } else if (act === 'delete') {
    const yes = await askUser({
      title: 'Delete this chat?', text: people.mode === 'people' ? `“${chat.title}” is removed from the server, on all your devices.`
        : `“${chat.title}” is removed from this browser and its cache from the server.`,
      type: null, ok: 'Delete', danger: true,
    });
    if (yes) deleteChat(chat);
  }
});
document.addEventListener('click', (e) => { if (els.chatMenu.open && !els.chatMenu.contains(e.target)) els.chatMenu.open = false; });

async function deleteChat(chat) {
  if (page.run && page.run.chat === chat) page.run.ctrl.abort();
  // Frees the conversation's KV cache now instead of at its TTL; 404 (expired) is fine.
  apiFetch(`v1/sessions/${encodeURIComponent(chat.sid)}`, { method: 'DELETE' }).catch(() => {});
  page.chats = page.chats.filter((c) => c !== chat);
  await page.store.del(chat.id).catch(() => {});
  if (page.current === chat) show(page.chats[0] || newChat());
  else renderList();
  say('Chat deleted');
}

els.import.addEventListener('click', () => els.importFile.click());
els.importFile.addEventListener('change', async () => {
  const file = els.importFile.files[0];
  els.importFile.value = '';
  if (!file) return;
  let chat;
  try {
    chat = parseImport(await file.text(), file.size);
  } catch (e) {
    toast(`Could not import ${file.name}: ${e.message}.`);
    return;
  }
  try {
    await page.store.put(chat);
  } catch (e) {
    toast(`Could not store ${file.name}: ${e && e.message}.`);
    return;
  }
  page.chats.push(chat);
  sortChats();
  show(chat);
  toast(`Imported “${chat.title}”.`);
});
