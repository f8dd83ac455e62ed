// The message box and its attachments; a question fitted to the chat, then sent.
import { generate } from './answer.js';
import { save } from './chats.js';
import { MAX_FILES, cutFile, readFile } from './attach.js';
import { chipList, endComposition, isSendKey, updateControls, watchComposition } from './messages.js';
import { askUser, els, finePointer, page, say, toast } from './page.js';
import { askKey, settings, systemPrompt } from './settings.js';
import { titleFrom } from './store.js';

function autosize() {
  els.input.style.height = 'auto';
  els.input.style.height = `${els.input.scrollHeight + 2}px`;
  els.input.style.overflowY = els.input.clientHeight < els.input.scrollHeight ? 'auto' : 'hidden';
}
async function submit() {
  const text = els.input.value.trim();
  if ((!text && !page.attached.length) || page.run || !page.healthy || page.sending || page.attached.some((f) => f.reading)) return;
  const chat = page.current;
  page.sending = true;
  updateControls();
  let files;
  try { files = await fitted(chat, text, page.attached); } finally { page.sending = false; updateControls(); }
  if (!files || page.run || page.current !== chat) return;
  els.input.value = '';
  autosize();
  page.attached = [];
  renderChips();
  if (!chat.messages.length) chat.title = titleFrom(text || files[0].name);
  chat.messages.push(files.length ? { role: 'user', content: text, files } : { role: 'user', content: text });
  if (page.current === chat) { els.chatTitle.textContent = chat.title; document.title = `${chat.title} · Chat`; }
  generate(chat);
}
els.composer.addEventListener('submit', (e) => { e.preventDefault(); submit(); });

function renderChips() {
  els.attachments.replaceChildren(...(page.attached.length ? [chipList(page.attached, true)] : []));
  els.attachments.hidden = !page.attached.length;
  updateControls();
}
async function attachFiles(list) {
  for (const file of [...list]) {
    if (page.attached.length >= MAX_FILES) { toast(`At most ${MAX_FILES} files go with one message.`); break; }
    const slot = { name: file.name || 'pasted file', size: file.size, reading: true };
    page.attached.push(slot);
    renderChips();
    try {
      page.attached[page.attached.indexOf(slot)] = await readFile(file, askKey);
      say(`${slot.name} attached`);
    } catch (e) {
      page.attached = page.attached.filter((f) => f !== slot);
      toast(`Could not attach ${slot.name}: ${e instanceof TypeError ? 'the server is unreachable' : e.message}.`);
    }
    renderChips();
  }
}
els.attach.addEventListener('click', () => els.attachFile.click());
els.attachFile.addEventListener('change', () => { attachFiles(els.attachFile.files); els.attachFile.value = ''; });
els.attachments.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-act=unattach]');
  if (b) { page.attached.splice(+b.dataset.i, 1); renderChips(); els.input.focus(); }
});
els.input.addEventListener('paste', (e) => {
  if (e.clipboardData && e.clipboardData.files.length) { e.preventDefault(); attachFiles(e.clipboardData.files); }
});
const hasFiles = (e) => e.dataTransfer && [...e.dataTransfer.types].includes('Files');
document.addEventListener('dragover', (e) => { if (hasFiles(e)) { e.preventDefault(); els.composer.classList.add('drop'); } });
document.addEventListener('dragleave', (e) => { if (!e.relatedTarget) els.composer.classList.remove('drop'); });
document.addEventListener('drop', (e) => {
  els.composer.classList.remove('drop');
  if (!hasFiles(e)) return;
  e.preventDefault(); // never navigate to the dropped file
  attachFiles(e.dataTransfer.files);
});

// Tokens the next question may still take: the server's prompt limit (the context less
// min(max_tokens, a quarter), a quarter assumed when unset), less the conversation so far
// (the last answer's usage) and the question (~3 characters a token, plus the template's).
function room(chat, question) {
  if (!page.ctxLimit) return Infinity;
  const maxTokens = parseInt(settings.maxTokens, 10);
  const limit = page.ctxLimit - Math.min(maxTokens > 0 ? maxTokens : page.ctxLimit, page.ctxLimit / 4);
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
watchComposition(els.input);
els.input.addEventListener('blur', endComposition);
els.input.addEventListener('keydown', (e) => {
  if (isSendKey(e)) { e.preventDefault(); submit(); }
});
// The chat's "Answer from the library" switch: kept with the chat, sent as `library: true`.
els.library.addEventListener('change', () => {
  page.current.library = els.library.checked;
  save(page.current);
});
els.stop.addEventListener('click', () => { if (page.run) page.run.ctrl.abort(); if (finePointer) els.input.focus(); });
