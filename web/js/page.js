// The page: its elements (els.chatList is #chat-list), the state its parts share, helpers.
export const els = Object.fromEntries([...document.querySelectorAll('[id]')]
  .map((e) => [e.id.replace(/-(\w)/g, (_, c) => c.toUpperCase()), e]));
export const page = {
  store: null,
  chats: [], // saved chats, newest first
  current: null, // the chat on screen (not in `chats` until its first message)
  run: null, // the request in flight: {chat, bot, ctrl, label, ...}
  healthy: false,
  modelId: null,
  ctxLimit: 0, // tokens one conversation holds (GET /v1/models), 0 until known
  attached: [], // the composer's files: as attach.js reads them, {reading: true} until then
  sending: false, // a question being fitted (cut) before it is sent
};
export const finePointer = matchMedia('(pointer: fine)').matches; // desktop: moving focus pops no keyboard
export const narrow = matchMedia('(max-width: 760px)'); // the chat list is a drawer

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}
export function button(text, act, label) {
  const b = el('button', 'mini', text);
  b.type = 'button';
  b.dataset.act = act;
  if (label) b.setAttribute('aria-label', label);
  return b;
}
let toastTimer = 0;
export function toast(text) {
  els.toast.textContent = text;
  els.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { els.toast.hidden = true; }, 6000);
}
export const say = (text) => { els.sr.textContent = ''; setTimeout(() => { els.sr.textContent = text; }, 50); };

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
export async function copyFrom(btn, text) {
  const ok = await copyText(text);
  const old = btn.dataset.label || btn.textContent;
  btn.dataset.label = old;
  btn.textContent = ok ? 'Copied' : 'Copy failed';
  say(ok ? 'Copied to the clipboard' : 'Copying failed');
  setTimeout(() => { btn.textContent = old; }, 1500);
}

export function download(name, type, text) {
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
export function askUser({ title, text = '', value = '', type = 'text', ok = 'OK', danger = false }) {
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
