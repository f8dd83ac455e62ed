// The question as a request, sent again until the server takes it (new key, busy, restarting).
import { apiFetch, plainWords, readError, sleep } from './api.js';
import { withFiles } from './attach.js';
import { checkHealth } from './health.js';
import { label } from './messages.js';
import { page } from './page.js';
import { askKey, settings, systemPrompt } from './settings.js';

const RETRY_DEFAULT_S = 5; // a 429 without Retry-After
const RETRY_503_MAX = 5; // tries while the server restarts, then the error is shown

export class Shown extends Error {} // an error already in plain words

// The chat's first upTo messages as the API takes them: the system prompt, then each
// message (a user's with its files).
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

export function requestBody(chat) {
  const body = { messages: apiMessages(chat, chat.messages.length - 1), stream: true, stream_options: { include_usage: true } };
  if (page.modelId) body.model = page.modelId;
  const temp = parseFloat(settings.temperature);
  if (Number.isFinite(temp)) body.temperature = temp;
  const maxTokens = parseInt(settings.maxTokens, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  if (chat.library) body.library = true; // the server finds passages and sends them as `sources`
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
export async function openAnswer(r, body) {
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
