// Attachments: a file turned into text for a message, with its token count. Text files are
// read here and counted by POST /tokenize; PDF, DOCX (and anything else, which the server
// refuses in words) go to POST /v1/documents/text. A file: {name, size, kind, text, tokens,
// truncated, pages?, cut?}, kept with its message (IndexedDB, export, import).
import { apiFetch, readError } from './api.js';

const TEXT = new Set(('txt text md markdown rst csv tsv json jsonl yaml yml toml ini cfg conf log xml html htm css js mjs '
  + 'ts tsx jsx py rb go rs java kt c h cc cpp hpp cs php sh bash sql r tex srt vtt env properties gradle swift scala '
  + 'lua pl diff patch').split(' '));
const HERE_MAX = 512 * 1024; // bytes; a longer text file goes to the server, which cuts it at its max_chars
const SIMPLE = /^(text\/plain|application\/x-www-form-urlencoded|multipart\/form-data)?$/; // the server's front door refuses these
const MARGIN = 0.9; // a cut keeps this share of the characters the tokens allow: tokens per character vary
export const MAX_FILES = 10;

export class AttachError extends Error {}

const suffix = (name) => ((/\.([^./]+)$/.exec(name) || [])[1] || '').toLowerCase();
const readsHere = (f) => f.size <= HERE_MAX && (TEXT.has(suffix(f.name)) || (!suffix(f.name) && f.type.startsWith('text/')));

// A JSON answer (null for 204), asking for a key once on 401 (askKey resolves true when one was entered).
export async function call(path, opts, askKey = async () => false) {
  for (;;) {
    const res = await apiFetch(path, { method: 'POST', ...opts });
    if (res.status === 401 && await askKey()) continue;
    if (!res.ok) {
      const e = await readError(res);
      throw new AttachError(e.message || `the server refused it (${e.status})`);
    }
    return res.status === 204 ? null : res.json();
  }
}

// A file sent as it is (not multipart): its type (a generic one for those the front door
// refuses) and its name, percent-encoded. Attachments and the library send files so.
export function fileBody(file, name = file.name) {
  const type = SIMPLE.test(file.type) ? 'application/octet-stream' : file.type;
  return { headers: { 'Content-Type': type, 'X-File-Name': encodeURIComponent(name) }, body: file };
}

export async function countTokens(text, askKey) {
  if (!text) return 0;
  const body = JSON.stringify({ content: text, parse_special: false });
  const j = await call('tokenize', { headers: { 'Content-Type': 'application/json' }, body }, askKey);
  return j.tokens.length;
}

export async function readFile(file, askKey) {
  const name = (file.name || 'pasted file').slice(0, 255);
  if (readsHere(file)) {
    const text = (await file.text()).replace(/^\uFEFF/, '');
    if (text.includes('\0') || text.includes('\uFFFD')) throw new AttachError('it is not a UTF-8 text file');
    if (!text.trim()) throw new AttachError('it holds no text');
    return { name, size: file.size, kind: 'text', text, tokens: await countTokens(text, askKey), truncated: false };
  }
  const j = await call('v1/documents/text', fileBody(file, name), askKey);
  const doc = { name, size: file.size, kind: j.kind, text: j.text, tokens: j.tokens, truncated: j.truncated };
  if (j.pages != null) doc.pages = j.pages;
  return doc;
}

// The first part of `f` that holds at most `tokens` tokens: cut by characters (MARGIN below
// the file's own characters per token), then counted again.
export async function cutFile(f, tokens, askKey) {
  let out = f;
  for (let i = 0; i < 3 && out.tokens > tokens; i++) {
    const text = out.text.slice(0, Math.floor(out.text.length * (tokens / out.tokens) * MARGIN));
    out = { ...out, text, tokens: await countTokens(text, askKey), cut: true };
  }
  return out;
}

// What the model reads: each file with its name, fenced as plain text, then the question.
export function withFiles(files, question) {
  const parts = (files || []).map((f) => {
    const fence = '`'.repeat(Math.max(3, ...(f.text.match(/`+/g) || []).map((s) => s.length + 1)));
    return `Attached file: ${f.name}${f.cut ? ' (first part only)' : ''}\n${fence}\n${f.text}\n${fence}`;
  });
  if (question) parts.push(question);
  return parts.join('\n\n');
}

export function fmtSize(n) {
  if (n < 1024) return `${n} B`;
  return n < 1024 * 1024 ? `${Math.round(n / 1024)} KB` : `${(n / 1024 / 1024).toFixed(1)} MB`;
}

// The chip's words: name · size · tokens (and whether it was cut).
export function chipText(f) {
  if (f.reading) return `${f.name} · ${fmtSize(f.size)} · reading…`;
  const cut = f.cut ? ' · first part' : f.truncated ? ' · cut by the server' : '';
  return `${f.name} · ${fmtSize(f.size)} · ${f.tokens.toLocaleString('en')} tokens${cut}`;
}

// An imported message's files checked whole, or a reason (a string) to refuse the import.
export function checkFiles(files) {
  if (files == null) return null;
  if (!Array.isArray(files) || files.length > MAX_FILES) return `its files are not a list of at most ${MAX_FILES}`;
  for (const f of files) {
    if (!f || typeof f.name !== 'string' || typeof f.text !== 'string' || !Number.isFinite(f.tokens)
        || !Number.isFinite(f.size)) return 'it has a file without a name, text, size or token count';
  }
  return null;
}
