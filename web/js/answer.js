// Asking the model: an answer pending at once, asked for (request.js), read as it streams
// (stream.js), painted as it grows, then settled (stats, notes, saved).
import { renderList, save, touch } from './chats.js';
import { checkHealth } from './health.js';
import { addMessage, clearWait, groundingOf, label, renderMessages, scrollDown, sourcesOf, update, updateControls, views } from './messages.js';
import { els, finePointer, page, say } from './page.js';
import { Shown, openAnswer, requestBody } from './request.js';
import { readAnswer } from './stream.js';

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

// One answer; every step works on the run `r`.
export async function generate(chat) {
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
  page.run = r;
  if (page.current === chat) {
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
  else if (e.type === 'sources') { bot.sources = sourcesOf(e.sources); schedulePaint(r); }
  else if (e.type === 'grounding') bot.grounding = groundingOf(e.grounding) || undefined;
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
  if (page.run === r) page.run = null;
  update(bot, true);
  touch(chat);
  save(chat);
  updateControls();
  scrollDown(false);
  checkHealth();
  if (page.current === chat) say(bot.error ? `Error: ${bot.error}` : 'Answer complete');
  if (finePointer && page.current === chat && document.activeElement === document.body) els.input.focus();
}

// The last answer asked for again (the server recomputes only the answer).
export function regenerate(chat) {
  if (page.run) return;
  const last = chat.messages[chat.messages.length - 1];
  if (!last || last.role !== 'assistant') return;
  chat.messages.pop();
  renderMessages();
  generate(chat);
}
