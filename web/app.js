// The chat page: chats in the sidebar, the conversation, the composer, settings.
// No build step: ES modules from web/js/, libraries from web/vendor/ (see render.js).
import { apiFetch, apiKey, plainWords, readError, sleep } from './js/api.js';
import { MAX_FILES, chipText, cutFile, readFile, withFiles } from './js/attach.js';
import { fileName, parseImport, toJSON, toMarkdown } from './js/chatfile.js';
import { renderMarkdown, renderPlain } from './js/render.js';
import { newChat, openStore, settle, titleFrom } from './js/store.js';
import { readAnswer } from './js/stream.js';

const $ = (id) => document.getElementById(id);
const els = {
  app: $('app'), sidebar: $('sidebar'), backdrop: $('backdrop'), toggleSide: $('toggle-side'), closeSide: $('close-side'),
  newChat: $('new-chat'), search: $('search'), list: $('chat-list'), listEmpty: $('list-empty'),
  import: $('import'), importFile: $('import-file'), storageNote: $('storage-note'),
  title: $('chat-title'), dot: $('status-dot'), status: $('status-text'), theme: $('theme'),
  openSettings: $('open-settings'), menu: $('chat-menu'),
  log: $('log'), empty: $('empty'), messages: $('messages'),
  form: $('composer'), input: $('input'), send: $('send'), stop: $('stop'),
  attach: $('attach'), attachFile: $('attach-file'), chips: $('attachments'),
  settings: $('settings'), preset: $('preset'), system: $('system'), presetText: $('preset-text'),
  temperature: $('temperature'), maxTokens: $('max-tokens'), themeSelect: $('theme-select'),
  keyState: $('key-state'), forgetKey: $('forget-key'),
  ask: $('ask'), askTitle: $('ask-title'), askText: $('ask-text'), askInput: $('ask-input'), askOk: $('ask-ok'),
  toast: $('toast'), sr: $('sr'),
};
const finePointer = matchMedia('(pointer: fine)').matches; // desktop: moving focus pops no keyboard
const narrow = matchMedia('(max-width: 760px)'); // the chat list is a drawer
const RETRY_DEFAULT_S = 5; // a 429 without Retry-After
const RETRY_503_MAX = 5; // tries while the server restarts, then the error is shown

let store = null;
let chats = []; // saved chats, newest first
let current = null; // the chat on screen (not in `chats` until its first message)
let run = null; // the request in flight: {chat, bot, ctrl, label, ...}
let healthy = false;
let modelId = null;
let ctxLimit = 0; // tokens one conversation holds (GET /v1/models), 0 until known
let attached = []; // the composer's files: as attach.js reads them, {reading: true} until then
let sending = false; // a question being fitted (cut) before it is sent
let presets = new Map(); // name -> text, from GET /v1/system_prompts
const views = new WeakMap(); // message -> its elements, for the chat on screen

// ---- small helpers ---------------------------------------------------------------------
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}
function button(text, act, label) {
  const b = el('button', 'mini', text);
  b.type = 'button';
  b.dataset.act = act;
  if (label) b.setAttribute('aria-label', label);
  return b;
}
let toastTimer = 0;
function toast(text) {
  els.toast.textContent = text;
  els.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { els.toast.hidden = true; }, 6000);
}
const say = (text) => { els.sr.textContent = ''; setTimeout(() => { els.sr.textContent = text; }, 50); };

// navigator.clipboard exists only in secure contexts; plain http on a LAN address falls
// back to a selected textarea and execCommand('copy').
async function copyText(text) {
  if (navigator.clipboard && navigator.clipboard.writeText) {
    try { await navigator.clipboard.writeText(text); return true; } catch { /* fall back */ }
  }
  const focus = document.activeElement;
  const ta = el('textarea', 'offscreen');
  ta.value = text;
  ta.setAttribute('readonly', '');
  document.body.append(ta);
  ta.select();
  let ok = false;
  try { ok = document.execCommand('copy'); } catch { /* unsupported */ }
  ta.remove();
  if (focus && focus.focus) focus.focus();
  return ok;
}
async function copyFrom(btn, text) {
  const ok = await copyText(text);
  const old = btn.dataset.label || btn.textContent;
  btn.dataset.label = old;
  btn.textContent = ok ? 'Copied' : 'Copy failed';
  say(ok ? 'Copied to the clipboard' : 'Copying failed');
  setTimeout(() => { btn.textContent = old; }, 1500);
}

function download(name, type, text) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = el('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// One dialog for questions: {title, text, value, type ('text'|'password'|null: no input),
// ok}. Resolves the entered text (or true without an input), null when cancelled.
function askUser({ title, text = '', value = '', type = 'text', ok = 'OK', danger = false }) {
  return new Promise((resolve) => {
    els.askTitle.textContent = title;
    els.askText.textContent = text;
    els.askText.hidden = !text;
    els.askInput.hidden = !type;
    els.askInput.type = type || 'text';
    els.askInput.value = value;
    els.askOk.textContent = ok;
    els.askOk.classList.toggle('danger', danger);
    els.ask.returnValue = '';
    els.ask.addEventListener('close', () => {
      const v = els.ask.returnValue === 'ok' ? (type ? els.askInput.value : true) : null;
      els.askInput.value = '';
      resolve(v);
    }, { once: true });
    els.ask.showModal();
    if (type) els.askInput.select();
  });
}

// ---- settings (per browser) ------------------------------------------------------------
const SETTINGS_KEY = 'chat.settings.v1';
function loadSettings() {
  let s = {};
  try { s = JSON.parse(localStorage.getItem(SETTINGS_KEY)) || {}; } catch { /* defaults */ }
  if (s.preset === undefined) s.preset = s.system ? 'custom' : ''; // the page before presets
  return {
    preset: String(s.preset || ''), presetText: String(s.presetText || ''), system: String(s.system || ''),
    temperature: s.temperature ?? '', maxTokens: s.maxTokens ?? '', theme: s.theme || '',
  };
}
let settings = loadSettings();
function saveSettings() {
  try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings)); } catch { /* this page only */ }
}
function systemPrompt() {
  if (settings.preset === 'custom') return settings.system.trim();
  if (settings.preset) return presets.get(settings.preset) ?? settings.presetText;
  return '';
}
function showSettings() {
  els.preset.value = settings.preset;
  if (els.preset.value !== settings.preset) els.preset.value = ''; // a preset the server dropped
  els.system.value = settings.system;
  els.temperature.value = settings.temperature;
  els.maxTokens.value = settings.maxTokens;
  els.themeSelect.value = settings.theme;
  syncPresetFields();
  const key = apiKey.get();
  els.keyState.textContent = key ? `set (…${key.slice(-4)})` : 'none';
  els.forgetKey.hidden = !key;
}
function syncPresetFields() {
  const p = els.preset.value;
  els.system.hidden = p !== 'custom';
  els.presetText.hidden = !p || p === 'custom';
  els.presetText.textContent = presets.get(p) || '';
}
function readSettings() {
  settings.preset = els.preset.value;
  settings.presetText = presets.get(settings.preset) || '';
  settings.system = els.system.value;
  settings.temperature = els.temperature.value;
  settings.maxTokens = els.maxTokens.value;
  syncPresetFields();
  saveSettings();
}
for (const e of [els.preset, els.system, els.temperature, els.maxTokens]) {
  e.addEventListener('input', readSettings);
  e.addEventListener('change', readSettings);
}
els.openSettings.addEventListener('click', () => { showSettings(); els.settings.showModal(); });
els.forgetKey.addEventListener('click', () => { apiKey.clear(); showSettings(); });

const THEMES = ['', 'light', 'dark'];
const THEME_NAMES = { '': 'follows the system', light: 'light', dark: 'dark' };
function applyTheme(t) {
  settings.theme = THEMES.includes(t) ? t : '';
  if (settings.theme) document.documentElement.dataset.theme = settings.theme;
  else delete document.documentElement.dataset.theme;
  els.theme.setAttribute('aria-label', `Theme: ${THEME_NAMES[settings.theme]} (switch)`);
  els.theme.title = els.theme.getAttribute('aria-label');
  els.themeSelect.value = settings.theme;
  saveSettings();
}
els.theme.addEventListener('click', () => applyTheme(THEMES[(THEMES.indexOf(settings.theme) + 1) % THEMES.length]));
els.themeSelect.addEventListener('change', () => applyTheme(els.themeSelect.value));

// ---- the API key -----------------------------------------------------------------------
let keyPrompt = null;
// Asks for a key after a 401; resolves true when one was entered. One question at a time.
function askKey() {
  if (!keyPrompt) {
    const had = apiKey.get();
    keyPrompt = askUser({
      title: 'API key needed',
      text: had ? 'The server did not accept the key. Enter another one (it is kept in this browser).'
        : 'This server asks for an API key. Enter yours (it is kept in this browser).',
      type: 'password', ok: 'Use key',
    }).then((k) => {
      keyPrompt = null;
      if (k && k.trim()) { apiKey.set(k.trim()); return true; }
      return false;
    });
  }
  return keyPrompt;
}

// ---- the chat list ---------------------------------------------------------------------
const sortChats = () => chats.sort((a, b) => b.updated - a.updated);
function renderList() {
  const q = els.search.value.trim().toLowerCase();
  const shown = chats.filter((c) => !q || c.title.toLowerCase().includes(q));
  els.list.replaceChildren(...shown.map((c) => {
    const li = el('li');
    const b = el('button', 'chat-item', c.title);
    b.type = 'button';
    b.dataset.id = c.id;
    b.title = c.title;
    if (current && c.id === current.id) b.setAttribute('aria-current', 'page');
    if (run && run.chat === c) b.classList.add('busy');
    li.append(b);
    return li;
  }));
  els.listEmpty.hidden = shown.length > 0;
  els.listEmpty.textContent = q ? 'No chat has that in its title.' : 'No chats yet.';
}
els.search.addEventListener('input', renderList);
els.list.addEventListener('click', (e) => {
  const b = e.target.closest('.chat-item');
  const chat = b && chats.find((c) => c.id === b.dataset.id);
  if (chat) show(chat);
});

function save(chat) {
  if (!chats.includes(chat)) return Promise.resolve();
  return store.put(chat).catch((e) => toast(`Could not save this chat: ${e && e.message}`));
}
function touch(chat) {
  chat.updated = Date.now();
  if (!chats.includes(chat)) chats.unshift(chat);
  sortChats();
  renderList();
}

function show(chat) {
  if (current && current !== chat) closeEdit();
  current = chat;
  try { localStorage.setItem('chat.current', chat.id); } catch { /* reopen the newest */ }
  els.title.textContent = chat.title;
  document.title = `${chat.title} · Chat`;
  renderMessages();
  renderList();
  setDrawer(false);
  updateControls();
}
function startNewChat() {
  show(newChat());
  els.input.focus();
}
els.newChat.addEventListener('click', startNewChat);

// ---- sidebar: a column on a desktop, a drawer on a phone ---------------------------------
let sideHidden = false;
function setDrawer(open) {
  if (!narrow.matches) return;
  els.app.classList.toggle('drawer-open', open);
  els.backdrop.hidden = !open;
  syncSide();
  if (open) els.search.focus();
}
function syncSide() {
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

// ---- chat actions menu -----------------------------------------------------------------
els.menu.addEventListener('click', async (e) => {
  const b = e.target.closest('button[data-act]');
  if (!b) return;
  els.menu.open = false;
  const chat = current;
  const act = b.dataset.act;
  if (act === 'rename') {
    const t = await askUser({ title: 'Rename chat', value: chat.title, ok: 'Rename' });
    if (t && t.trim()) {
      chat.title = t.trim().slice(0, 200);
      if (chats.includes(chat)) { save(chat); } else touch(chat);
      if (current === chat) show(chat);
      renderList();
    }
  } else if (act === 'export-md') {
    download(fileName(chat, 'md'), 'text/markdown', toMarkdown(chat));
  } else if (act === 'export-json') {
    download(fileName(chat, 'json'), 'application/json', toJSON(chat));
  } else if (act === 'delete') {
    const yes = await askUser({
      title: 'Delete this chat?', text: `“${chat.title}” is removed from this browser and its cache from the server.`,
      type: null, ok: 'Delete', danger: true,
    });
    if (yes) deleteChat(chat);
  }
});
document.addEventListener('click', (e) => { if (els.menu.open && !els.menu.contains(e.target)) els.menu.open = false; });

async function deleteChat(chat) {
  if (run && run.chat === chat) run.ctrl.abort();
  // Frees the conversation's KV cache now instead of at its TTL; 404 (expired) is fine.
  apiFetch(`v1/sessions/${encodeURIComponent(chat.sid)}`, { method: 'DELETE' }).catch(() => {});
  chats = chats.filter((c) => c !== chat);
  await store.del(chat.id).catch(() => {});
  if (current === chat) show(chats[0] || newChat());
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
    await store.put(chat);
  } catch (e) {
    toast(`Could not store ${file.name}: ${e && e.message}.`);
    return;
  }
  chats.push(chat);
  sortChats();
  show(chat);
  toast(`Imported “${chat.title}”.`);
});

// ---- messages --------------------------------------------------------------------------
let stick = true; // follow the bottom of the log while streaming
els.log.addEventListener('scroll', () => {
  stick = els.log.scrollHeight - els.log.scrollTop - els.log.clientHeight < 40;
});
new ResizeObserver(() => scrollDown(false)).observe(els.log);
function scrollDown(force) {
  if (force) stick = true;
  if (stick) els.log.scrollTop = els.log.scrollHeight;
}

function addMessage(m) {
  const user = m.role === 'user';
  const art = el('article', `msg ${user ? 'user' : 'assistant'}`);
  art.setAttribute('aria-label', user ? 'You' : 'Assistant');
  const bubble = el('div', 'bubble');
  const text = el('div', user ? 'text plain' : 'text md');
  const notes = el('div', 'notes');
  if (m.files && m.files.length) bubble.append(chipList(m.files));
  bubble.append(text, notes);
  const meta = el('div', 'meta');
  const stats = el('span', 'stats');
  const actions = el('div', 'actions');
  actions.append(button('Copy', 'copy', user ? 'Copy your message' : 'Copy the answer'));
  if (user) actions.append(button('Edit', 'edit', 'Edit and send again'));
  else actions.append(button('Regenerate', 'regenerate', 'Write this answer again'));
  meta.append(stats, actions);
  art.append(bubble, meta);
  els.messages.append(art);
  views.set(m, { art, bubble, text, notes, stats, actions, wait: null });
  update(m, true);
}

function update(m, final) {
  const v = views.get(m);
  if (!v) return;
  if (m.role === 'user') renderPlain(v.text, m.content);
  else renderMarkdown(v.text, m.content, final);
  const notes = [];
  if (m.dropped) notes.push(['note', `${m.dropped} earlier message${m.dropped === 1 ? ' was' : 's were'} left out to fit the model's context.`]);
  if (m.note) notes.push(['note', `(${m.note})`]);
  if (m.error) notes.push(['error', m.error]);
  v.notes.replaceChildren(...notes.map(([cls, t]) => el('p', cls, t)));
  v.stats.textContent = m.stats || '';
  if (m.usage) {
    v.art.dataset.promptTokens = m.usage.prompt;
    v.art.dataset.cachedTokens = m.usage.cached;
    v.art.dataset.completionTokens = m.usage.completion;
  }
}

function setWait(m, label) {
  const v = views.get(m);
  if (!v) return;
  if (!v.wait) {
    v.wait = el('div', 'typing');
    for (let i = 0; i < 3; i++) v.wait.append(el('span', 'dot3'));
    v.wait.append(el('span', 'label'));
    v.bubble.append(v.wait);
  }
  v.wait.lastChild.textContent = label || '';
}
function clearWait(m) {
  const v = views.get(m);
  if (v && v.wait) { v.wait.remove(); v.wait = null; }
}

function refreshActions() {
  if (!current) return;
  const ms = current.messages;
  ms.forEach((m, i) => {
    const v = views.get(m);
    if (!v) return;
    const streaming = run && run.bot === m;
    v.art.classList.toggle('streaming', !!streaming);
    v.art.setAttribute('aria-busy', streaming ? 'true' : 'false');
    for (const b of v.actions.querySelectorAll('button')) {
      const act = b.dataset.act;
      if (act === 'regenerate') b.hidden = i !== ms.length - 1 || !!streaming;
      if (act === 'copy') b.hidden = !m.content;
      if (act === 'edit' || act === 'regenerate') b.disabled = !!run || !healthy;
    }
  });
}

function renderMessages() {
  els.messages.replaceChildren();
  for (const m of current.messages) addMessage(m);
  els.empty.hidden = current.messages.length > 0;
  if (run && run.chat === current) {
    if (!run.tFirst) setWait(run.bot, run.label);
  }
  refreshActions();
  scrollDown(true);
}

els.messages.addEventListener('click', (e) => {
  const b = e.target.closest('button');
  if (!b || !current) return;
  if (b.dataset.copy === 'code') {
    const code = b.closest('.code').querySelector('pre code');
    copyFrom(b, code ? code.textContent : '');
    return;
  }
  const art = b.closest('article');
  const i = [...els.messages.children].indexOf(art);
  const m = current.messages[i];
  if (!m) return;
  if (b.dataset.act === 'copy') copyFrom(b, m.content);
  else if (b.dataset.act === 'regenerate') regenerate(current);
  else if (b.dataset.act === 'edit') openEdit(m);
});

// Editing an earlier message and sending it again: everything after it is replaced. The
// server keeps the conversation's cache, so the turns before it are not computed again.
let editing = null; // {m, box}
function openEdit(m) {
  if (run) return;
  closeEdit();
  const v = views.get(m);
  const box = el('div', 'edit');
  const ta = el('textarea');
  ta.value = m.content;
  ta.rows = Math.min(12, m.content.split('\n').length + 1);
  ta.setAttribute('aria-label', 'Edit your message');
  const row = el('div', 'buttons');
  const ok = el('button', 'btn primary', 'Send');
  ok.type = 'button';
  const cancel = el('button', 'btn', 'Cancel');
  cancel.type = 'button';
  row.append(cancel, ok);
  box.append(ta, row);
  v.bubble.hidden = true;
  v.art.insertBefore(box, v.bubble);
  editing = { m, box, v };
  ta.focus();
  const done = () => {
    const text = ta.value.trim();
    if ((!text && !m.files) || run || !healthy) return;
    const chat = current;
    const i = chat.messages.indexOf(m);
    closeEdit();
    chat.messages.splice(i);
    chat.messages.push(m.files ? { role: 'user', content: text, files: m.files } : { role: 'user', content: text });
    renderMessages();
    generate(chat);
  };
  ok.addEventListener('click', done);
  cancel.addEventListener('click', () => { closeEdit(); v.actions.querySelector('[data-act=edit]').focus(); });
  ta.addEventListener('keydown', (e) => {
    if (isSendKey(e)) { e.preventDefault(); done(); } else if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); cancel.click(); }
  });
  ta.addEventListener('compositionstart', () => { composing = true; });
  ta.addEventListener('compositionend', () => { composing = false; });
}
function closeEdit() {
  if (!editing) return;
  editing.box.remove();
  editing.v.bubble.hidden = false;
  editing = null;
}

function regenerate(chat) {
  if (run) return;
  const last = chat.messages[chat.messages.length - 1];
  if (!last || last.role !== 'assistant') return;
  chat.messages.pop();
  renderMessages();
  generate(chat);
}

// ---- composer ----------------------------------------------------------------------------
let composing = false; // an IME composition (Chinese, Japanese input) is open
// Enter sends, Shift+Enter is a new line, and Enter that ends an IME composition never sends.
const isSendKey = (e) => e.key === 'Enter' && !e.shiftKey && !e.isComposing && !composing && e.keyCode !== 229;

function updateControls() {
  const mine = run && run.chat === current;
  els.send.hidden = !!mine;
  els.stop.hidden = !mine;
  els.send.disabled = !healthy || !!run || sending || attached.some((f) => f.reading)
    || (!els.input.value.trim() && !attached.length);
  els.send.title = run && !mine ? 'Another chat is answering' : '';
  refreshActions();
}
function autosize() {
  els.input.style.height = 'auto';
  els.input.style.height = `${els.input.scrollHeight + 2}px`;
  els.input.style.overflowY = els.input.clientHeight < els.input.scrollHeight ? 'auto' : 'hidden';
}
async function submit() {
  const text = els.input.value.trim();
  if ((!text && !attached.length) || run || !healthy || sending || attached.some((f) => f.reading)) return;
  const chat = current;
  sending = true;
  updateControls();
  let files;
  try { files = await fitted(chat, text, attached); } finally { sending = false; updateControls(); }
  if (!files || run || current !== chat) return;
  els.input.value = '';
  autosize();
  attached = [];
  renderChips();
  if (!chat.messages.length) chat.title = titleFrom(text || files[0].name);
  chat.messages.push(files.length ? { role: 'user', content: text, files } : { role: 'user', content: text });
  if (current === chat) { els.title.textContent = chat.title; document.title = `${chat.title} · Chat`; }
  generate(chat);
}
els.form.addEventListener('submit', (e) => { e.preventDefault(); submit(); });

// ---- attachments ---------------------------------------------------------------------------
function chipList(files, remove) {
  const box = el('div', 'chips');
  files.forEach((f, i) => {
    const chip = el('span', 'chip', chipText(f));
    chip.title = f.name;
    if (f.tokens != null) chip.dataset.tokens = f.tokens;
    if (remove && !f.reading) {
      const x = button('✕', 'unattach', `Remove ${f.name}`);
      x.dataset.i = i;
      chip.append(x);
    }
    box.append(chip);
  });
  return box;
}
function renderChips() {
  els.chips.replaceChildren(...(attached.length ? [chipList(attached, true)] : []));
  els.chips.hidden = !attached.length;
  updateControls();
}
async function attachFiles(list) {
  for (const file of [...list]) {
    if (attached.length >= MAX_FILES) { toast(`At most ${MAX_FILES} files go with one message.`); break; }
    const slot = { name: file.name || 'pasted file', size: file.size, reading: true };
    attached.push(slot);
    renderChips();
    try {
      attached[attached.indexOf(slot)] = await readFile(file, askKey);
      say(`${slot.name} attached`);
    } catch (e) {
      attached = attached.filter((f) => f !== slot);
      toast(`Could not attach ${slot.name}: ${e instanceof TypeError ? 'the server is unreachable' : e.message}.`);
    }
    renderChips();
  }
}
els.attach.addEventListener('click', () => els.attachFile.click());
els.attachFile.addEventListener('change', () => { attachFiles(els.attachFile.files); els.attachFile.value = ''; });
els.chips.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-act=unattach]');
  if (b) { attached.splice(+b.dataset.i, 1); renderChips(); els.input.focus(); }
});
els.input.addEventListener('paste', (e) => {
  if (e.clipboardData && e.clipboardData.files.length) { e.preventDefault(); attachFiles(e.clipboardData.files); }
});
const hasFiles = (e) => e.dataTransfer && [...e.dataTransfer.types].includes('Files');
document.addEventListener('dragover', (e) => { if (hasFiles(e)) { e.preventDefault(); els.form.classList.add('drop'); } });
document.addEventListener('dragleave', (e) => { if (!e.relatedTarget) els.form.classList.remove('drop'); });
document.addEventListener('drop', (e) => {
  els.form.classList.remove('drop');
  if (!hasFiles(e)) return;
  e.preventDefault(); // never navigate to the dropped file
  attachFiles(e.dataTransfer.files);
});

// Tokens the next question may still take: the server's prompt limit (the context less
// min(max_tokens, a quarter), a quarter assumed when unset), less the conversation so far
// (the last answer's usage) and the question (~3 characters a token, plus the template's).
function room(chat, question) {
  if (!ctxLimit) return Infinity;
  const maxTokens = parseInt(settings.maxTokens, 10);
  const limit = ctxLimit - Math.min(maxTokens > 0 ? maxTokens : ctxLimit, ctxLimit / 4);
  const last = chat.messages.findLast((m) => m.usage);
  const used = last ? last.usage.prompt + last.usage.completion : Math.ceil(systemPrompt().length / 3);
  return Math.floor(limit - used - question.length / 3 - 32);
}

// The files as they will be sent: all of them when they fit; otherwise, if the user agrees,
// the first part of each in turn that fits. null: not sent.
async function fitted(chat, question, files) {
  const need = files.reduce((n, f) => n + f.tokens, 0);
  const left = room(chat, question);
  if (!files.length || need <= left) return files;
  const what = files.length === 1 ? files[0].name : `The ${files.length} files`;
  if (left < 64) {
    toast(`${what} (${need.toLocaleString('en')} tokens) will not fit in this chat: start a new chat for it.`);
    return null;
  }
  const yes = await askUser({
    title: 'Too long for this chat', type: null, ok: 'Send the first part',
    text: `${what}: ${need.toLocaleString('en')} tokens; this chat can take about ${left.toLocaleString('en')} more. `
      + 'Send only the first part?',
  });
  if (!yes) return null;
  const out = [];
  let budget = left;
  for (const f of files) {
    if (budget < 64) break;
    const part = f.tokens <= budget ? f : await cutFile(f, budget, askKey);
    out.push(part);
    budget -= part.tokens;
  }
  return out;
}
els.input.addEventListener('input', () => { autosize(); updateControls(); });
els.input.addEventListener('compositionstart', () => { composing = true; });
els.input.addEventListener('compositionend', () => { composing = false; });
els.input.addEventListener('blur', () => { composing = false; });
els.input.addEventListener('keydown', (e) => {
  if (isSendKey(e)) { e.preventDefault(); submit(); }
});
els.stop.addEventListener('click', () => { if (run) run.ctrl.abort(); if (finePointer) els.input.focus(); });

// Keyboard: Ctrl+Shift+O new chat, Esc stops, Shift+Esc or / puts the cursor in the box.
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
    if (els.menu.open) { els.menu.open = false; els.menu.querySelector('summary').focus(); } else if (els.app.classList.contains('drawer-open')) setDrawer(false);
    else if (run) run.ctrl.abort();
  } else if (e.key === '/' && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) {
    e.preventDefault();
    els.input.focus();
  }
});

// ---- asking the model --------------------------------------------------------------------
function apiMessages(chat, upTo) {
  const out = [];
  const system = systemPrompt();
  if (system) out.push({ role: 'system', content: system });
  const ms = chat.messages.slice(0, upTo);
  for (let i = 0; i < ms.length; i++) {
    const next = ms[i + 1];
    // Skip failed exchanges (no answer text) so roles keep alternating.
    if (ms[i].role === 'user' && next && next.role === 'assistant' && !next.content) { i++; continue; }
    if (ms[i].role === 'assistant' && !ms[i].content) continue;
    out.push({ role: ms[i].role, content: ms[i].role === 'user' ? withFiles(ms[i].files, ms[i].content) : ms[i].content });
  }
  return out;
}

class Shown extends Error {} // an error already in plain words

function label(r, text) {
  r.label = text;
  if (!r.tFirst) setWait(r.bot, text);
}

// Queue position and the server's estimate, counted down between its notes (1 s apart).
function queueLabel(r) {
  const q = r.queue;
  if (!q) return;
  if (q.position == null) { label(r, 'Waiting for a free slot…'); return; }
  let t = `Waiting in the queue: position ${q.position}`;
  if (q.eta != null) {
    const left = Math.max(0, Math.round(q.eta - (performance.now() - q.at) / 1000));
    t += left > 0 ? `, about ${left} s` : ', any moment now';
  }
  label(r, t);
}

// One answer: shown at once as pending, asked for (with retries), read as it streams, then
// settled (stats, notes, saved). Every step works on the run `r`.
async function generate(chat) {
  const r = startAnswer(chat);
  const body = requestBody(chat);
  try {
    const res = await openAnswer(r, body);
    streamStarted(r, res);
    await readAnswer(res.body, (e) => take(r, e));
    if (r.finish === 'length') r.bot.note = 'cut off: max tokens reached';
  } catch (e) {
    failed(r.bot, e);
  } finally {
    endAnswer(r);
  }
}

// The pending answer on screen and saved; it becomes the run in flight.
function startAnswer(chat) {
  const bot = { role: 'assistant', content: '', pending: true };
  chat.messages.push(bot);
  touch(chat);
  const r = {
    chat, bot, ctrl: new AbortController(), label: '', tFirst: 0, queue: null, tick: 0, done: false,
    t0: 0, n: 0, usage: null, finish: null, frame: 0, lastPaint: 0, lastSave: Date.now(),
  };
  run = r;
  if (current === chat) {
    els.empty.hidden = true;
    for (const m of chat.messages) if (!views.get(m)) addMessage(m);
  }
  updateControls();
  renderList();
  label(r, '');
  scrollDown(true);
  save(chat);
  return r;
}

function requestBody(chat) {
  const body = { messages: apiMessages(chat, chat.messages.length - 1), stream: true, stream_options: { include_usage: true } };
  if (modelId) body.model = modelId;
  const temp = parseFloat(settings.temperature);
  if (Number.isFinite(temp)) body.temperature = temp;
  const maxTokens = parseInt(settings.maxTokens, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  return body;
}

function postChat(r, body) {
  return apiFetch('v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream', 'X-Session-Id': r.chat.sid },
    body: JSON.stringify(body),
    signal: r.ctrl.signal,
  });
}

// Sends the question until the server takes it: again after a new key (401), while it is busy
// (429, unless over the daily quota) and while it restarts (503 with Retry-After, RETRY_503_MAX
// tries). Returns the streaming response; any other refusal is thrown as Shown.
async function openAnswer(r, body) {
  for (let attempt = 1; ; attempt++) {
    r.t0 = performance.now();
    const res = await postChat(r, body);
    if (res.status === 401) {
      const err = await readError(res);
      if (await askKey()) continue;
      throw new Shown(plainWords(err));
    }
    const restarting = res.status === 503 && res.headers.has('Retry-After') && attempt <= RETRY_503_MAX;
    if (res.status === 429 || restarting) {
      const err = await readError(res);
      // Over the daily quota: trying again cannot help before midnight; say so, as the server does.
      if (err.code === 'quota_exceeded') throw new Shown(plainWords(err));
      await waitToRetry(r, err, restarting, attempt);
      continue;
    }
    if (!res.ok) {
      const err = await readError(res);
      if (res.status === 503) checkHealth();
      throw new Shown(plainWords(err));
    }
    if (!res.body) throw new Shown('This browser cannot stream answers.');
    return res;
  }
}

// Busy (429), or restarting / loading (503 with Retry-After): wait as long as the
// server asks, counting down; Stop ends the wait.
async function waitToRetry(r, err, restarting, attempt) {
  if (restarting) checkHealth();
  const why = restarting ? 'The server is restarting' : 'The server is busy';
  for (let s = err.retryAfter ?? RETRY_DEFAULT_S; s > 0; s--) {
    label(r, `${why}. Trying again in ${s} s${attempt > 1 ? ` (try ${attempt + 1})` : ''}…`);
    await sleep(1000, r.ctrl.signal);
  }
  label(r, 'Trying again…');
}

function streamStarted(r, res) {
  const dropped = parseInt(res.headers.get('X-Dropped-Messages') || '', 10);
  if (dropped > 0) r.bot.dropped = dropped;
  label(r, '');
  r.tick = setInterval(() => queueLabel(r), 1000);
}

// One event of the stream (js/stream.js), applied to the answer.
function take(r, e) {
  const bot = r.bot;
  if (e.type === 'queue') {
    if (!r.tFirst) { r.queue = { position: e.position, eta: e.eta, at: performance.now() }; queueLabel(r); }
  } else if (e.type === 'delta') {
    if (!r.tFirst) { r.tFirst = performance.now(); clearInterval(r.tick); clearWait(bot); }
    r.n++;
    bot.content += e.text;
    schedulePaint(r);
  } else if (e.type === 'prompt') {
    r.queue = null; // out of the queue: the prompt is being read
    if (!r.tFirst && e.total) label(r, `reading the document: ${Math.floor((100 * e.done) / e.total)} %`);
  } else if (e.type === 'finish') r.finish = e.reason;
  else if (e.type === 'usage') r.usage = e.usage;
  else if (e.type === 'dropped') bot.dropped = e.count;
  else if (e.type === 'error') bot.error = `The server stopped this answer${e.message ? `: ${e.message}` : '.'}`;
}

function schedulePaint(r) {
  if (r.frame) return;
  // At most one render every 50 ms: re-parsing a long answer on every token costs.
  const wait = Math.max(0, 50 - (performance.now() - r.lastPaint));
  r.frame = setTimeout(() => requestAnimationFrame(() => paint(r)), wait);
}

// The answer so far with its speed; saved at most once a second while it grows.
function paint(r) {
  r.frame = 0;
  if (r.done) return; // a frame that was already queued when the answer ended
  r.lastPaint = performance.now();
  const v = views.get(r.bot);
  if (v) {
    update(r.bot, false);
    const secs = (performance.now() - r.tFirst) / 1000;
    if (r.n > 1 && secs > 0.2) v.stats.textContent = `${r.n} tokens · ${((r.n - 1) / secs).toFixed(1)} tok/s`;
    scrollDown(false);
  }
  if (Date.now() - r.lastSave > 1000) { r.lastSave = Date.now(); save(r.chat); }
}

function failed(bot, e) {
  if (e.name === 'AbortError') bot.note = 'stopped';
  else if (e instanceof Shown) bot.error = e.message;
  else if (e instanceof TypeError) {
    bot.error = 'Could not reach the server. Check the connection and try again.';
    checkHealth();
  } else bot.error = String(e && e.message || e);
}

// The answer's stats line, and its token counts (kept with the message) when the server sent them.
function recordStats(r, tEnd) {
  const { bot, usage, tFirst } = r;
  const tokens = (usage && usage.completion_tokens) || r.n;
  if (!tokens) return;
  const stats = [`${tokens} token${tokens === 1 ? '' : 's'}`];
  if (tFirst) stats.push(`first token ${((tFirst - r.t0) / 1000).toFixed(1)} s`);
  if (tFirst && tokens > 1 && tEnd > tFirst) stats.push(`${((tokens - 1) / ((tEnd - tFirst) / 1000)).toFixed(1)} tok/s`);
  if (usage) {
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    bot.usage = { prompt: usage.prompt_tokens, cached, completion: usage.completion_tokens };
    stats.push(`${cached} of ${usage.prompt_tokens} prompt tokens cached`);
  }
  bot.stats = stats.join(' · ');
}

// The answer settled however it ended: final render, saved, the page ready for the next one.
function endAnswer(r) {
  const { chat, bot } = r;
  r.done = true;
  clearTimeout(r.frame);
  clearInterval(r.tick);
  recordStats(r, performance.now());
  if (!bot.content && !bot.error && !bot.note) bot.note = 'empty reply';
  delete bot.pending;
  clearWait(bot);
  if (run === r) run = null;
  update(bot, true);
  touch(chat);
  save(chat);
  updateControls();
  scrollDown(false);
  checkHealth();
  if (current === chat) say(bot.error ? `Error: ${bot.error}` : 'Answer complete');
  if (finePointer && current === chat && document.activeElement === document.body) els.input.focus();
}

// ---- server status -----------------------------------------------------------------------
const STATUS_TEXT = { ok: 'ready', loading: 'loading the model…', draining: 'restarting…', offline: 'offline' };
let healthTimer = 0;
async function checkHealth() {
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
  const was = healthy;
  healthy = state === 'ok';
  const text = (STATUS_TEXT[state] || state) + detail;
  if (els.status.textContent !== text) els.status.textContent = text;
  els.dot.className = `dot ${healthy ? 'ok' : state === 'offline' ? 'down' : ''}`;
  if (healthy && (!was || !modelId)) loadServerInfo();
  updateControls();
  healthTimer = setTimeout(checkHealth, healthy ? 15000 : 3000);
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
      if (id) { modelId = id; els.title.title = `Model: ${id}`; }
      const m = (j && j.data && j.data[0]) || {};
      ctxLimit = m.max_model_len || (m.meta && m.meta.n_ctx) || 0;
    }
    const p = await apiFetch('v1/system_prompts');
    if (p.ok) {
      const j = await p.json();
      presets = new Map((j.data || []).filter((x) => x && typeof x.name === 'string').map((x) => [x.name, String(x.text || '')]));
      for (const o of [...els.preset.options]) if (o.dataset.preset) o.remove();
      for (const name of presets.keys()) {
        const o = el('option', null, `Preset: ${name}`);
        o.value = name;
        o.dataset.preset = '1';
        els.preset.append(o);
      }
    }
  } catch { /* the page works without the model name and presets */ } finally {
    infoLoading = false;
  }
}

// ---- start ---------------------------------------------------------------------------------
async function start() {
  applyTheme(settings.theme);
  syncSide();
  if (narrow.matches) els.sidebar.inert = true;
  store = await openStore();
  els.storageNote.hidden = store.persistent;
  chats = (await store.all()).map(settle);
  sortChats();
  let last = null;
  try { last = localStorage.getItem('chat.current'); } catch { /* newest */ }
  // The chat open before the reload; a new one when that was never sent or was deleted.
  if (store.migrated) last = store.migrated;
  show(chats.find((c) => c.id === last) || (last ? null : chats[0]) || newChat());
  checkHealth();
  if (finePointer) els.input.focus();
  document.documentElement.dataset.ready = '1';
}
start();
