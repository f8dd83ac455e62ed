// Export a chat as Markdown or JSON; import a JSON export. An import is checked whole
// before anything is stored: a malformed or hostile file is refused with the reason.
import { newId } from './api.js';
import { checkFiles, withFiles } from './attach.js';
import { titleFrom } from './store.js';

export const FORMAT = 'appliance-chat';
const MAX_FILE_BYTES = 32 * 1024 * 1024; // attachments travel with their text
const MAX_MESSAGES = 5000;
const MAX_TITLE = 200;

export function toJSON(chat) {
  return JSON.stringify({
    format: FORMAT,
    version: 1,
    title: chat.title,
    created: new Date(chat.created).toISOString(),
    updated: new Date(chat.updated).toISOString(),
    messages: chat.messages.filter((m) => m.content || m.files).map((m) => (m.files
      ? { role: m.role, content: m.content, files: m.files } : { role: m.role, content: m.content })),
  }, null, 2);
}

// A source as the Markdown export lists it: with the sentence that supports the answer, or
// said to be given and not used (an answer checked by the server; older ones: title and page).
const source = (s) => `[${s.n}] ${s.title}${s.page != null ? `, p. ${s.page}` : ''}`
  + (s.support ? `: “${s.support}”` : s.used === false ? ' (also given, not used)' : '')
  + (s.quoted && s.used === false ? ' (the closest the sources come)' : '');

export function toMarkdown(chat) {
  const parts = [`# ${chat.title}`, ''];
  for (const m of chat.messages) {
    if (!m.content && !m.files) continue;
    parts.push(m.role === 'user' ? '**You:**' : '**Assistant:**', '', m.files ? withFiles(m.files, m.content) : m.content, '');
    if (m.sources && m.sources.length) parts.push('Sources:  \n' + m.sources.map(source).join('  \n'), '');
    const g = m.grounding;
    if (g && g.unsupported.length) parts.push(`Not in the library's sources: ${g.unsupported.join(', ')}`, '');
  }
  return parts.join('\n');
}

export function fileName(chat, ext) {
  const base = chat.title.replace(/[^\p{L}\p{N}]+/gu, '-').replace(/^-+|-+$/g, '').slice(0, 50) || 'chat';
  return `${base}.${ext}`;
}

class ImportError extends Error {}
const refuse = (why) => { throw new ImportError(why); };

// file text -> a new chat (new local id, new session id), or throws ImportError.
export function parseImport(text, size) {
  if (size > MAX_FILE_BYTES) refuse(`the file is larger than ${MAX_FILE_BYTES / 1024 / 1024} MB`);
  let j;
  try { j = JSON.parse(text); } catch { refuse('it is not JSON'); }
  if (!j || typeof j !== 'object' || Array.isArray(j)) refuse('it is not a chat export');
  if (j.format !== FORMAT) refuse(`it is not a chat export (no "format": "${FORMAT}")`);
  if (j.version !== 1) refuse(`its version ${JSON.stringify(j.version)} is not supported`);
  if (!Array.isArray(j.messages) || !j.messages.length) refuse('it has no messages');
  if (j.messages.length > MAX_MESSAGES) refuse(`it has more than ${MAX_MESSAGES} messages`);
  const messages = j.messages.map((m, i) => {
    if (!m || typeof m !== 'object') refuse(`message ${i + 1} is not an object`);
    if (m.role !== 'user' && m.role !== 'assistant') refuse(`message ${i + 1} has role ${JSON.stringify(String(m.role)).slice(0, 40)}`);
    if (typeof m.content !== 'string') refuse(`message ${i + 1} has no text`);
    const bad = m.role === 'user' ? checkFiles(m.files) : null;
    if (bad) refuse(`message ${i + 1}: ${bad}`);
    if (m.role !== 'user' || !m.files || !m.files.length) return { role: m.role, content: m.content };
    const files = m.files.map((f) => ({ name: f.name.slice(0, 255), size: f.size, kind: String(f.kind || 'text'), text: f.text,
      tokens: f.tokens, truncated: !!f.truncated, ...(f.cut ? { cut: true } : {}), ...(f.pages != null ? { pages: +f.pages } : {}) }));
    return { role: m.role, content: m.content, files };
  });
  if (j.title != null && typeof j.title !== 'string') refuse('its title is not text');
  const title = (j.title || '').trim().slice(0, MAX_TITLE) || titleFrom((messages.find((m) => m.role === 'user') || {}).content);
  const time = (s) => { const t = Date.parse(s); return Number.isFinite(t) ? t : Date.now(); };
  const now = Date.now();
  return { id: newId(), sid: newId(), title, created: time(j.created), updated: now, messages };
}
