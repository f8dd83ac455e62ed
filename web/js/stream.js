// A streamed chat answer (OpenAI chunks over SSE) read as events, in the order the server
// sent them. Knows the wire format only; what the page does with an event is answer.js's.

// Reads an SSE body line by line: onComment(text) for ': ...' lines; onData(payload) for
// each event, returning false to stop reading.
async function readSSE(body, onComment, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let data = [];
  const line = (l) => {
    if (l === '') {
      if (!data.length) return true;
      const payload = data.join('\n');
      data = [];
      return onData(payload) !== false;
    }
    if (l[0] === ':') onComment(l.slice(1).trim());
    else if (l.startsWith('data:')) data.push(l.slice(l[5] === ' ' ? 6 : 5));
    return true;
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buf += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let m;
      while ((m = /\r\n|\r|\n/.exec(buf))) {
        if (!done && m[0] === '\r' && m.index === buf.length - 1) break; // maybe half of \r\n
        const l = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (!line(l)) return;
      }
      if (done) { if (buf) line(buf); line(''); return; }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// ': queued N', ': queued N eta S' or ': busy' -> {position, eta} (null fields when absent).
function parseQueueNote(text) {
  const q = /^queued\s+(\d+)(?:\s+eta\s+(\d+))?/.exec(text);
  if (q) return { position: +q[1], eta: q[2] != null ? +q[2] : null };
  if (/^busy\b/.test(text)) return { position: null, eta: null };
  return null;
}

// Reads the body to its end ('[DONE]', an error event or the end of the stream), calling
// onEvent with one of:
//   {type: 'queue', position, eta}  a ': queued N eta S' or ': busy' note (null fields when absent)
//   {type: 'prompt', done, total}   a ': prompt N/M' note: N of the prompt's M tokens computed
//   {type: 'dropped', count}        earlier messages were left out to fit the context
//   {type: 'sources', sources}      the library's passages the answer may cite as [n] (first chunk; again
//                                   in the last, each with `used` and `support`)
//   {type: 'grounding', grounding}  the answer checked against them (last chunk): verdict, unsupported, dropped
//   {type: 'delta', text}           the next piece of the answer
//   {type: 'finish', reason}        why the answer ended ('stop', 'length', ...)
//   {type: 'usage', usage}          the token counts, as the server sent them
//   {type: 'error', message}        the server stopped the answer (message may be empty); the last event
export function readAnswer(body, onEvent) {
  return readSSE(body, (comment) => {
    const q = parseQueueNote(comment);
    const p = /^prompt\s+(\d+)\/(\d+)/.exec(comment);
    if (q) onEvent({ type: 'queue', ...q });
    else if (p) onEvent({ type: 'prompt', done: +p[1], total: +p[2] });
  }, (payload) => {
    if (payload.trim() === '[DONE]') return false;
    let j;
    try { j = JSON.parse(payload); } catch { return true; } // not JSON: skipped
    if (j.error) {
      onEvent({ type: 'error', message: typeof j.error === 'string' ? j.error : j.error.message });
      return false;
    }
    for (const e of chunkEvents(j)) onEvent(e);
    return true;
  });
}

// One chunk's events: dropped, sources, delta, grounding, finish, usage (each only when present).
function chunkEvents(j) {
  const out = [];
  if (j.dropped_messages > 0) out.push({ type: 'dropped', count: j.dropped_messages });
  if (Array.isArray(j.sources)) out.push({ type: 'sources', sources: j.sources });
  const choice = j.choices && j.choices[0];
  const delta = choice && choice.delta && choice.delta.content;
  if (delta) out.push({ type: 'delta', text: delta });
  if (j.grounding) out.push({ type: 'grounding', grounding: j.grounding });
  if (choice && choice.finish_reason) out.push({ type: 'finish', reason: choice.finish_reason });
  if (j.usage) out.push({ type: 'usage', usage: j.usage });
  return out;
}
