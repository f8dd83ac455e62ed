// The chat page, wired: the parts in js/ (answer.js asks POST v1/chat/completions) joined by a
// message's buttons and the shortcuts, then started. ES modules, no build step.
import { generate, regenerate } from './js/answer.js';
import { apiFetch } from './js/api.js';
import { setDrawer, show, sortChats, startNewChat, syncSide } from './js/chats.js';
import './js/composer.js';
import { checkHealth } from './js/health.js';
import { openEdit } from './js/messages.js';
import { copyFrom, els, finePointer, narrow, page, toast } from './js/page.js';
import { applyTheme, settings } from './js/settings.js';
import { peopleModule } from './js/people-load.js';
import { fragment, people, whoAmI } from './js/who.js';
import { newChat, openStore, settle } from './js/store.js';

els.messages.addEventListener('click', (e) => {
  const b = e.target.closest('button');
  if (!b || !page.current) return;
  if (b.dataset.copy === 'code') {
    const code = b.closest('.code').querySelector('pre code');
    copyFrom(b, code ? code.textContent : '');
    return;
  }
  const art = b.closest('article');
  const i = [...els.messages.children].indexOf(art);
  const m = page.current.messages[i];
  if (!m) return;
  if (b.dataset.act === 'copy') copyFrom(b, m.content);
  else if (b.dataset.act === 'regenerate') regenerate(page.current);
  else if (b.dataset.act === 'edit') openEdit(m, generate);
});

// Ctrl+Shift+O new chat, Esc stops, Shift+Esc or / puts the cursor in the box.
document.addEventListener('keydown', (e) => {
  if (document.querySelector('dialog[open]')) return;
  const typing = e.target.closest && e.target.closest('input, textarea, select, [contenteditable]');
  if ((e.ctrlKey || e.metaKey) && e.shiftKey && (e.key === 'O' || e.key === 'o')) {
    e.preventDefault();
    startNewChat();
  } else if (e.key === 'Escape' && e.shiftKey) {
    e.preventDefault();
    els.input.focus();
  } else if (e.key === 'Escape') {
    if (els.chatMenu.open) { els.chatMenu.open = false; els.chatMenu.querySelector('summary').focus(); } else if (els.app.classList.contains('drawer-open')) setDrawer(false);
    else if (page.run) page.run.ctrl.abort();
  } else if (e.key === '/' && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) {
    e.preventDefault();
    els.input.focus();
  }
});

// Where chats are kept: on the box in people mode (after signing in), else in this browser.
async function openChats() {
  await whoAmI();
  if (people.mode !== 'people') {
    page.store = await openStore();
    els.storageNote.hidden = page.store.persistent;
    return;
  }
  const [{ signIn }, { ServerStore }] = await Promise.all([peopleModule(), import('./js/serverstore.js')]);
  if (!people.person) await signIn();
  const trouble = (text) => {
    els.storageNote.textContent = text || '';
    els.storageNote.hidden = !text;
  };
  page.store = new ServerStore(trouble, (chat) => {
    if (page.current === chat) show(chat);
    toast('This chat was changed on another device: it is shown as it is there now.');
  });
  trouble(people.saving ? null : 'Chats are not being saved on the server right now.');
}

// The "Answer from the library" switch, shown when there is a library to answer from (in
// people mode a person may add their own documents to an empty one).
async function offerLibrary() {
  try {
    const res = await apiFetch('v1/library');
    const data = res.ok ? (await res.json()).data : null;
    els.libraryRow.hidden = !(Array.isArray(data) && (data.length || people.mode === 'people'));
  } catch { /* no library: no switch */ }
}

async function start() {
  applyTheme(settings.theme);
  syncSide();
  if (narrow.matches) els.sidebar.inert = true;
  await openChats();
  offerLibrary();
  page.chats = (await page.store.all().catch((e) => { els.storageNote.textContent = `Could not load your chats: ${e.message}`; els.storageNote.hidden = false; return []; })).map(settle);
  sortChats();
  let last = null;
  try { last = localStorage.getItem('chat.current'); } catch { /* newest */ }
  // The chat open before the reload; a new one when that was never sent or was deleted.
  if (page.store.migrated) last = page.store.migrated;
  const shared = people.mode === 'people' && fragment('share')
    ? await (await peopleModule()).sharedChat(fragment('share')) : null;
  show(shared || page.chats.find((c) => c.id === last) || (last ? null : page.chats[0]) || newChat());
  checkHealth();
  if (finePointer) els.input.focus();
  document.documentElement.dataset.ready = '1';
}
// Back to this tab: the chat on screen may have gone on on another device.
document.addEventListener('visibilitychange', () => {
  if (document.visibilityState === 'visible' && people.mode === 'people' && page.current && !page.current.readOnly) {
    show(page.current);
  }
});
// A share link opened in a tab that has the page already (only the fragment changes).
window.addEventListener('hashchange', async () => {
  const token = people.mode === 'people' && people.person ? fragment('share') : null;
  const shared = token ? await (await peopleModule()).sharedChat(token) : null;
  if (shared) show(shared);
});
start();
