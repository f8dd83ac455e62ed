// The conversation on screen: messages, their notes and wait labels, which buttons are
// live; editing an earlier message; when Enter sends.
import { chipText } from './attach.js';
import { button, el, els, page } from './page.js';
import { renderMarkdown, renderPlain } from './render.js';

export const views = new WeakMap(); // message -> its elements, for the chat on screen
let ground = null; // js/ground.js, loaded with the first answer that has a figure to mark
let stick = true; // follow the bottom of the log while streaming
els.log.addEventListener('scroll', () => {
  stick = els.log.scrollHeight - els.log.scrollTop - els.log.clientHeight < 40;
});
new ResizeObserver(() => scrollDown(false)).observe(els.log);
export function scrollDown(force) {
  if (force) stick = true;
  if (stick) els.log.scrollTop = els.log.scrollHeight;
}

export function addMessage(m) {
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

export function update(m, final) {
  const v = views.get(m);
  if (!v) return;
  if (m.role === 'user') renderPlain(v.text, m.content);
  else renderMarkdown(v.text, m.content, final);
  const g = m.grounding;
  if (m.sources && m.sources.length) cite(v.text, m.sources, g ? g.dropped : []);
  if (g && g.unsupported.length) {
    if (ground) ground.markUnsupported(v.text, g.unsupported);
    else import('./ground.js').then((mod) => { ground = mod; update(m, !m.pending); });
  }
  if (v.shown !== m.sources) { // built again only when they change: an open passage stays open while the answer grows
    v.shown = m.sources;
    if (v.sources) v.sources.remove();
    v.sources = m.sources && m.sources.length ? sourceList(m.sources) : null;
    if (v.sources) v.text.after(v.sources);
  }
  const notes = [];
  if (m.dropped) notes.push(['note', `${m.dropped} earlier message${m.dropped === 1 ? ' was' : 's were'} left out to fit the model's context.`]);
  if (g && ['partly', 'unsupported'].includes(g.verdict)) notes.push(['warn', "Some figures in this answer are not in the library's sources."]);
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

// The library's passages an answer was given (the stream's `sources`), as kept with it.
// Checked at the answer's end (each `used`, its `support`; `quoted`: the server quoted its
// sentence after an answer that does not stand): kept in the order shown, used first, then quoted.
const rank = (s) => (s.used === false ? (s.quoted ? 1 : 2) : 0);
export const sourcesOf = (list) => (Array.isArray(list) ? list : [])
  .filter((s) => s && Number.isInteger(s.n) && typeof s.title === 'string')
  .map((s) => ({ n: s.n, document: String(s.document || ''), title: s.title.slice(0, 300),
    page: Number.isInteger(s.page) ? s.page : null, text: String(s.text || '').slice(0, 8000),
    ...(typeof s.used === 'boolean' ? { used: s.used, support: s.support ? String(s.support).slice(0, 2000) : null } : {}),
    ...(s.quoted === true ? { quoted: true } : {}) }))
  .sort((a, b) => rank(a) - rank(b));
// The stream's `grounding` (the answer checked against its sources) as kept with it; null: not one.
export function groundingOf(g) {
  if (!g || !['supported', 'partly', 'unsupported', 'not_in_library'].includes(g.verdict)) return null;
  const list = (a, ok) => (Array.isArray(a) ? a.slice(0, 50).filter(ok) : []);
  return { verdict: g.verdict, dropped: list(g.dropped, Number.isInteger),
    unsupported: list(g.unsupported, (w) => typeof w === 'string' && w.trim()).map((w) => w.slice(0, 100)) };
}
const where = (s) => `${s.title}${s.page != null ? `, p. ${s.page}` : ''}`;

// "Sources:" and each one a <details>: [n], the sentence that supports the answer, title,
// page; opened, the passage. The ones given but not used apart, after them. Text only.
function sourceList(list) {
  const box = el('div', 'sources');
  box.setAttribute('role', 'group');
  box.setAttribute('aria-label', 'Sources');
  if (list.some((s) => s.used !== false)) box.append(el('p', 'small muted', 'Sources:'));
  let apart = false, closest = false;
  for (const s of list) {
    if (s.used === false && s.quoted && !closest) { closest = true; box.append(el('p', 'small muted', 'The closest the sources come:')); }
    if (s.used === false && !s.quoted && !apart) { apart = true; box.append(el('p', 'small muted', 'Also given, not used:')); }
    const d = el('details', s.used === false && !s.quoted ? 'unused' : null);
    d.dataset.n = s.n;
    const sum = el('summary', null, `[${s.n}] `);
    if (s.support) sum.append(el('q', 'support', s.support), ' — ');
    sum.append(where(s));
    d.append(sum, el('blockquote', null, s.text));
    box.append(d);
  }
  return box;
}

// [n] (or [1, 2]) in the rendered answer, outside code and links, becomes a button per
// source the answer used (or the server quoted) that opens it; a [n] the server dropped (its passage does not
// support the sentence) is left out; a number no source has stays text. Runs after sanitizing.
function cite(root, list, dropped) {
  const byN = new Map(list.map((s) => [s.n, s]));
  const gone = new Set(dropped);
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const hits = [];
  for (let t; (t = walk.nextNode());) if (/\[\d/.test(t.data) && !t.parentElement.closest('pre, code, a')) hits.push(t);
  for (const t of hits) {
    t.replaceWith(...t.data.split(/(\s?\[\d{1,3}(?:[,，]\s*\d{1,3})*\])/).flatMap((part, i) => {
      const ns = i % 2 ? part.match(/\d+/g).map(Number) : [];
      if (!ns.length || !ns.every((n) => byN.has(n))) return [part];
      const kept = ns.filter((n) => !gone.has(n));
      return kept.length ? [part.slice(0, part.indexOf('[')), ...kept.map((n) => citeButton(byN.get(n)))] : [];
    }));
  }
}
function citeButton(s) {
  if (s.used === false && !s.quoted) return `[${s.n}]`;
  const b = button(`[${s.n}]`, 'cite', `Source ${s.n}: ${where(s)}`);
  b.className = 'cite';
  b.dataset.cite = s.n;
  return b;
}
els.messages.addEventListener('click', (e) => {
  const b = e.target.closest('button.cite');
  const d = b && b.closest('.bubble').querySelector(`.sources details[data-n="${b.dataset.cite}"]`);
  if (d) { d.open = true; d.querySelector('summary').focus(); }
});

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
export function clearWait(m) {
  const v = views.get(m);
  if (v && v.wait) { v.wait.remove(); v.wait = null; }
}

function refreshActions() {
  if (!page.current) return;
  const ms = page.current.messages;
  ms.forEach((m, i) => {
    const v = views.get(m);
    if (!v) return;
    const streaming = page.run && page.run.bot === m;
    v.art.classList.toggle('streaming', !!streaming);
    v.art.setAttribute('aria-busy', streaming ? 'true' : 'false');
    for (const b of v.actions.querySelectorAll('button')) {
      const act = b.dataset.act;
      if (act === 'regenerate') b.hidden = i !== ms.length - 1 || !!streaming;
      if (act === 'copy') b.hidden = !m.content;
      if (act === 'edit' || act === 'regenerate') b.disabled = !!page.run || !page.healthy;
    }
  });
}

export function renderMessages() {
  els.messages.replaceChildren();
  for (const m of page.current.messages) addMessage(m);
  els.empty.hidden = page.current.messages.length > 0;
  if (page.run && page.run.chat === page.current) {
    if (!page.run.tFirst) setWait(page.run.bot, page.run.label);
  }
  refreshActions();
  scrollDown(true);
}

// The wait label of a run's answer, shown until its first token.
export function label(r, text) {
  r.label = text;
  if (!r.tFirst) setWait(r.bot, text);
}

// Files as chips: a sent message's, or the composer's with a ✕ each (remove).
export function chipList(files, remove) {
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

// Send or Stop, and every message's buttons, as the run and the server allow.
export function updateControls() {
  const mine = page.run && page.run.chat === page.current;
  els.send.hidden = !!mine;
  els.stop.hidden = !mine;
  els.send.disabled = !page.healthy || !!page.run || page.sending || page.attached.some((f) => f.reading)
    || (page.current && (page.current.stub || page.current.readOnly))
    || (!els.input.value.trim() && !page.attached.length);
  els.send.title = page.run && !mine ? 'Another chat is answering' : '';
  refreshActions();
}

let composing = false; // an IME composition (Chinese, Japanese input) is open
export function watchComposition(ta) {
  ta.addEventListener('compositionstart', () => { composing = true; });
  ta.addEventListener('compositionend', () => { composing = false; });
}
export const endComposition = () => { composing = false; };
// Enter sends, Shift+Enter is a new line, and Enter that ends an IME composition never sends.
export const isSendKey = (e) => e.key === 'Enter' && !e.shiftKey && !e.isComposing && !composing && e.keyCode !== 229;

// Editing an earlier message and sending it again: everything after it is replaced. The
// server keeps the conversation's cache, so the turns before it are not computed again.
// Send calls send(chat).
let editing = null; // {m, box, v}
export function openEdit(m, send) {
  if (page.run) return;
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
    if ((!text && !m.files) || page.run || !page.healthy) return;
    const chat = page.current;
    const i = chat.messages.indexOf(m);
    closeEdit();
    chat.messages.splice(i);
    chat.messages.push(m.files ? { role: 'user', content: text, files: m.files } : { role: 'user', content: text });
    renderMessages();
    send(chat);
  };
  ok.addEventListener('click', done);
  cancel.addEventListener('click', () => { closeEdit(); v.actions.querySelector('[data-act=edit]').focus(); });
  ta.addEventListener('keydown', (e) => {
    if (isSendKey(e)) { e.preventDefault(); done(); } else if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); cancel.click(); }
  });
  watchComposition(ta);
}
export function closeEdit() {
  if (!editing) return;
  editing.box.remove();
  editing.v.bubble.hidden = false;
  editing = null;
}
