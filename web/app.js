'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const els = {
    log: $('log'), empty: $('empty'), form: $('composer'), input: $('input'), send: $('send'), stop: $('stop'),
    newChat: $('new-chat'), model: $('model'), dot: $('status-dot'), status: $('status-text'),
    settings: $('settings'), system: $('system'), temperature: $('temperature'), maxTokens: $('max-tokens'),
  };
  const CONV_KEY = 'chat.conversation.v1';
  const SETTINGS_KEY = 'chat.settings.v1';

  const store = {
    get(key) { try { return JSON.parse(localStorage.getItem(key)); } catch { return null; } },
    set(key, value) { try { localStorage.setItem(key, JSON.stringify(value)); } catch { /* disabled or full */ } },
  };

  // crypto.randomUUID only exists in secure contexts; plain http on the LAN needs the fallback.
  function newId() {
    if (typeof crypto.randomUUID === 'function') {
      try { return crypto.randomUUID(); } catch { /* fall through */ }
    }
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  let conv = loadConv();
  let modelId = null;
  let healthy = false;
  let busy = null; // AbortController of the running request
  let healthTimer = 0;
  let stick = true; // follow the bottom of the log while streaming
  const finePointer = matchMedia('(pointer: fine)').matches; // desktop: safe to move focus without popping a keyboard

  function loadConv() {
    const c = store.get(CONV_KEY);
    if (c && typeof c.id === 'string' && Array.isArray(c.messages)) {
      for (const m of c.messages) {
        m.content = String(m.content || '');
        if (m.role === 'assistant' && (m.pending || (!m.content && !m.error && !m.note))) m.note = 'interrupted';
        delete m.pending;
      }
      return c;
    }
    return { id: newId(), messages: [] };
  }
  const saveConv = () => store.set(CONV_KEY, conv);

  // ---- settings -------------------------------------------------------------
  function loadSettings() {
    const s = store.get(SETTINGS_KEY) || {};
    els.system.value = s.system || '';
    els.temperature.value = s.temperature ?? '';
    els.maxTokens.value = s.maxTokens ?? '';
    els.settings.open = !!s.open;
  }
  function saveSettings() {
    store.set(SETTINGS_KEY, {
      system: els.system.value, temperature: els.temperature.value,
      maxTokens: els.maxTokens.value, open: els.settings.open,
    });
  }
  for (const el of [els.system, els.temperature, els.maxTokens]) el.addEventListener('input', saveSettings);
  els.settings.addEventListener('toggle', saveSettings);

  // ---- rendering (textContent only: model output is never parsed as HTML) ----
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  // Splits on ``` fences; odd parts become <pre><code>. An unclosed fence (mid-stream) renders as code.
  function renderText(target, text) {
    target.textContent = '';
    const parts = text.split('```');
    parts.forEach((part, i) => {
      if (i % 2 === 0) {
        if (i > 0) part = part.replace(/^\n/, '');
        if (i < parts.length - 1) part = part.replace(/\n$/, '');
        if (part) target.append(part);
        return;
      }
      const nl = part.indexOf('\n');
      if (nl >= 0 && /^[\w+#.-]*$/.test(part.slice(0, nl).trim())) part = part.slice(nl + 1); // language tag
      const pre = el('pre');
      pre.append(el('code', null, part.replace(/\n$/, '')));
      target.append(pre);
    });
  }

  function addMessage(m) {
    els.empty.hidden = true;
    const wrap = el('div', `msg ${m.role === 'user' ? 'user' : 'assistant'}`);
    const bubble = el('div', 'bubble');
    const text = el('div', 'text');
    bubble.append(text);
    wrap.append(bubble);
    els.log.append(wrap);
    const view = { wrap, bubble, text, typing: null, extra: null, stats: null };
    update(view, m);
    return view;
  }

  function update(view, m) {
    renderText(view.text, m.content);
    if (view.extra) view.extra.remove();
    view.extra = null;
    if (m.error || m.note) {
      view.extra = el('div', m.error ? 'error' : 'note', m.error ? `Error: ${m.error}` : `(${m.note})`);
      view.bubble.append(view.extra);
    }
    if (m.stats && !view.stats) view.wrap.append(view.stats = el('div', 'stats'));
    if (view.stats) view.stats.textContent = m.stats || '';
  }

  function showTyping(view, label) {
    if (!view.typing) {
      view.typing = el('div', 'typing');
      const dots = [el('span'), el('span'), el('span')];
      for (const d of dots) d.setAttribute('aria-hidden', 'true');
      view.typing.append(...dots, el('span', 'label'));
      view.bubble.append(view.typing);
    }
    view.typing.lastChild.textContent = label || '';
  }
  function hideTyping(view) {
    if (view.typing) view.typing.remove();
    view.typing = null;
  }

  function renderAll() {
    for (const n of [...els.log.querySelectorAll('.msg')]) n.remove();
    els.empty.hidden = conv.messages.length > 0;
    conv.messages.forEach(addMessage);
    scrollDown(true);
  }

  els.log.addEventListener('scroll', () => {
    stick = els.log.scrollHeight - els.log.scrollTop - els.log.clientHeight < 40;
  });
  // The log shrinks when a phone's keyboard opens or the window is resized: keep the newest
  // message in view if the user was at the bottom.
  new ResizeObserver(() => scrollDown(false)).observe(els.log);
  function scrollDown(force) {
    if (force) stick = true;
    if (stick) els.log.scrollTop = els.log.scrollHeight;
  }

  // ---- controls ---------------------------------------------------------------
  function updateControls() {
    els.send.hidden = !!busy;
    els.stop.hidden = !busy;
    els.send.disabled = !healthy || !!busy || !els.input.value.trim();
    els.log.setAttribute('aria-busy', busy ? 'true' : 'false');
  }
  function autosize() {
    els.input.style.height = 'auto';
    els.input.style.height = `${els.input.scrollHeight + 2}px`;
    els.input.style.overflowY = els.input.clientHeight < els.input.scrollHeight ? 'auto' : 'hidden';
  }
  function submit() {
    const text = els.input.value.trim();
    if (!text || busy || !healthy) return;
    els.input.value = '';
    autosize();
    send(text);
  }
  els.form.addEventListener('submit', (e) => { e.preventDefault(); submit(); });
  els.input.addEventListener('input', () => { autosize(); updateControls(); });
  els.input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      submit();
    } else if (e.key === 'Escape' && busy) {
      busy.abort();
    }
  });
  els.stop.addEventListener('click', () => { if (busy) busy.abort(); if (finePointer) els.input.focus(); });
  els.newChat.addEventListener('click', () => {
    if (busy) busy.abort();
    // The old conversation is gone from this page: free its KV cache on the server now
    // instead of waiting for its TTL. Best effort; 404 (already expired) is fine.
    if (conv.messages.length) {
      fetch('v1/sessions/' + encodeURIComponent(conv.id), { method: 'DELETE' }).catch(() => {});
    }
    conv = { id: newId(), messages: [] };
    saveConv();
    renderAll();
    els.input.focus();
  });

  // ---- chat request -----------------------------------------------------------
  function apiMessages() {
    const out = [];
    const system = els.system.value.trim();
    if (system) out.push({ role: 'system', content: system });
    const ms = conv.messages;
    for (let i = 0; i < ms.length; i++) {
      const next = ms[i + 1];
      // Skip failed exchanges (no assistant text) so roles keep alternating.
      if (ms[i].role === 'user' && next && next.role === 'assistant' && !next.content) { i++; continue; }
      out.push({ role: ms[i].role, content: ms[i].content });
    }
    return out;
  }

  async function errorText(res) {
    const raw = await res.text().catch(() => '');
    let msg = raw.trim().slice(0, 500);
    try {
      const j = JSON.parse(raw);
      msg = (j.error && (j.error.message || (typeof j.error === 'string' && j.error))) || j.detail || j.message || msg;
    } catch { /* not JSON */ }
    return `${res.status}${res.statusText ? ' ' + res.statusText : ''}${msg ? ': ' + msg : ''}`;
  }

  // Reads an SSE body line by line. onComment(text); onData(payload) returns false to stop.
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
      if (l[0] === ':') onComment(l.slice(1));
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

  async function send(text) {
    const user = { role: 'user', content: text };
    conv.messages.push(user);
    addMessage(user);
    const messages = apiMessages();
    // `pending` is saved with the text while it streams: a reload mid-answer shows the
    // answer as interrupted instead of passing a cut text off as complete.
    const bot = { role: 'assistant', content: '', pending: true };
    conv.messages.push(bot);
    const view = addMessage(bot);
    saveConv();

    const ctrl = new AbortController();
    busy = ctrl;
    updateControls();
    view.wrap.classList.add('streaming');
    showTyping(view, '');
    scrollDown(true);

    const t0 = performance.now();
    let tFirst = 0, usage = null, finish = null, frame = 0, lastSave = 0;
    const paint = () => {
      frame = 0;
      renderText(view.text, bot.content);
      scrollDown(false);
      if (Date.now() - lastSave > 1000) { lastSave = Date.now(); saveConv(); }
    };

    try {
      const body = { messages, stream: true, stream_options: { include_usage: true } };
      if (modelId) body.model = modelId;
      const temp = parseFloat(els.temperature.value);
      if (Number.isFinite(temp)) body.temperature = temp;
      const maxTokens = parseInt(els.maxTokens.value, 10);
      if (maxTokens > 0) body.max_tokens = maxTokens;

      const res = await fetch('v1/chat/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream', 'X-Session-Id': conv.id },
        body: JSON.stringify(body),
        signal: ctrl.signal,
      });
      if (!res.ok) {
        if (res.status === 503) checkHealth();
        throw new Error(await errorText(res));
      }
      if (!res.body) throw new Error('this browser cannot stream responses');

      await readSSE(res.body, (comment) => {
        const q = /^\s*queued\s+(\d+)/.exec(comment);
        if (q && !tFirst) showTyping(view, `waiting in queue (position ${q[1]})…`);
      }, (payload) => {
        if (payload.trim() === '[DONE]') return false;
        let j;
        try { j = JSON.parse(payload); } catch { return true; }
        if (j.error) {
          bot.error = typeof j.error === 'string' ? j.error : (j.error.message || JSON.stringify(j.error));
          return false;
        }
        const choice = j.choices && j.choices[0];
        const delta = choice && choice.delta && choice.delta.content;
        if (delta) {
          if (!tFirst) { tFirst = performance.now(); hideTyping(view); }
          bot.content += delta;
          if (!frame) frame = requestAnimationFrame(paint);
        }
        if (choice && choice.finish_reason) finish = choice.finish_reason;
        if (j.usage) usage = j.usage;
        return true;
      });
      if (finish === 'length') bot.note = 'cut off: max tokens reached';
    } catch (e) {
      if (e.name === 'AbortError') bot.note = 'stopped';
      else {
        bot.error = e instanceof TypeError ? `connection problem (${e.message})` : e.message;
        if (e instanceof TypeError) checkHealth();
      }
    } finally {
      if (frame) cancelAnimationFrame(frame);
      const tEnd = performance.now();
      const n = usage && usage.completion_tokens;
      if (n) {
        const stats = [`${n} tokens`];
        if (tFirst) stats.push(`first token ${((tFirst - t0) / 1000).toFixed(1)} s`);
        if (tFirst && n > 1 && tEnd > tFirst) stats.push(`${((n - 1) / ((tEnd - tFirst) / 1000)).toFixed(1)} tok/s`);
        bot.stats = stats.join(' · ');
      }
      if (!bot.content && !bot.error && !bot.note) bot.note = 'empty reply';
      delete bot.pending;
      hideTyping(view);
      view.wrap.classList.remove('streaming');
      update(view, bot);
      saveConv();
      if (busy === ctrl) busy = null;
      updateControls();
      scrollDown(false);
      if (finePointer && document.activeElement === document.body) els.input.focus();
    }
  }

  // ---- server status --------------------------------------------------------
  const STATUS_TEXT = { ok: 'ready', loading: 'loading model…', draining: 'draining…', offline: 'offline' };

  async function checkHealth() {
    clearTimeout(healthTimer);
    let state = 'offline';
    try {
      const res = await fetch('health', { cache: 'no-store' });
      const j = await res.json().catch(() => ({}));
      state = res.ok ? 'ok' : (j.status || `error ${res.status}`);
    } catch { /* unreachable */ }
    healthy = state === 'ok';
    els.status.textContent = STATUS_TEXT[state] || state;
    els.dot.className = `dot ${healthy ? 'ok' : state === 'offline' ? 'down' : ''}`;
    if (healthy && !modelId) loadModel();
    updateControls();
    healthTimer = setTimeout(checkHealth, healthy ? 30000 : 3000);
  }

  async function loadModel() {
    try {
      const j = await (await fetch('v1/models', { cache: 'no-store' })).json();
      const id = j && j.data && j.data[0] && j.data[0].id;
      if (id) {
        modelId = id;
        els.model.textContent = id;
        document.title = `Chat · ${id}`;
      }
    } catch { /* model stays omitted from requests */ }
  }

  loadSettings();
  renderAll();
  updateControls();
  checkHealth();
  if (finePointer) els.input.focus();
})();
