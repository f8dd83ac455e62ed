// The library's documents as a list: the chat page's "My documents" (v1/library, people mode,
// loaded by people.js) and the operator's Library section (admin/library). Each with its
// indexing progress (listed again every second while one is indexing), added (the file's
// bytes as they are, as attachments are sent), replaced, deleted; the server's words on error.
import { call, fileBody, fmtSize } from './attach.js';

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}
const when = (s) => new Date(s * 1000).toLocaleString([], { dateStyle: 'medium', timeStyle: 'short' });
function state(d) {
  if (d.status === 'indexing') return `indexing: ${d.indexed} of ${d.passages} passages`;
  return d.status === 'failed' ? `failed${d.error ? `: ${d.error}` : ''}` : 'ready';
}
// A file from a picker opened now (null when cancelled).
function pickFile() {
  return new Promise((resolve) => {
    const i = el('input');
    i.type = 'file';
    i.addEventListener('change', () => resolve(i.files[0] || null), { once: true });
    i.addEventListener('cancel', () => resolve(null), { once: true });
    i.click();
  });
}

// o: {base, list, empty, error, input (adds its files), keep (doc -> listed?), askKey,
// confirm (text -> Promise<bool>), changed (docs)}. Returns {load, add}.
export function shelf(o) {
  let timer = 0;
  const problem = (t) => { o.error.textContent = t || ''; o.error.hidden = !t; };
  const send = (path, opts) => call(path, opts, o.askKey);
  const words = (e) => (e instanceof TypeError ? 'the server is unreachable' : e.message);

  async function load() {
    clearTimeout(timer);
    let docs;
    try { docs = (await send(o.base, { method: 'GET' })).data.filter(o.keep || Boolean); } catch (e) {
      problem(`Could not list the documents: ${words(e)}`);
      return null;
    }
    o.list.replaceChildren(...docs.map(row));
    o.empty.hidden = docs.length > 0;
    if (docs.some((d) => d.status === 'indexing')) timer = setTimeout(load, 1000);
    if (o.changed) o.changed(docs);
    return docs;
  }

  async function put(file, id) {
    const note = el('li', 'small muted', `${file.name}: sending…`);
    o.list.append(note);
    o.empty.hidden = true;
    try {
      await send(id ? `${o.base}/${encodeURIComponent(id)}` : o.base, { method: id ? 'PUT' : 'POST', ...fileBody(file) });
      return true;
    } catch (e) {
      problem(`Could not ${id ? 'replace the document with' : 'add'} ${file.name}: ${words(e)}`);
      return false;
    } finally {
      note.remove();
    }
  }
  async function add(files) {
    problem(null);
    for (const f of [...files]) if (!await put(f)) break;
    load();
  }

  function row(d) {
    const name = d.title || d.name;
    const li = el('li');
    li.dataset.id = d.id;
    li.dataset.status = d.status;
    const facts = [d.name, fmtSize(d.size), d.pages ? `${d.pages} page${d.pages === 1 ? '' : 's'}` : '',
      `added ${when(d.added_at)}${d.added_by ? ` by ${d.added_by}` : ''}`].filter(Boolean).join(' · ');
    const status = el('span', `status-${d.status}`, state(d));
    li.append(el('strong', 'doc-title', name), el('span', 'small muted', facts), status);
    if (d.status === 'indexing') {
      const bar = el('progress');
      bar.max = Math.max(1, d.passages);
      bar.value = d.indexed;
      bar.setAttribute('aria-label', `Indexing ${name}`);
      status.append(' ', bar);
    }
    const act = (text, label, fn) => {
      const b = el('button', 'mini', text);
      b.type = 'button';
      b.setAttribute('aria-label', `${label} ${name}`);
      b.addEventListener('click', async () => { problem(null); if (await fn()) load(); });
      return b;
    };
    const id = encodeURIComponent(d.id);
    const buttons = el('span', 'doc-actions');
    buttons.append(
      act('Replace…', 'Replace', async () => { const f = await pickFile(); return f && put(f, d.id); }),
      act('Delete', 'Delete', async () => {
        if (!await o.confirm(`Delete “${name}” from the library? Chats stop finding it.`)) return false;
        try { await send(`${o.base}/${id}`, { method: 'DELETE' }); } catch (e) { problem(`Could not delete ${name}: ${words(e)}`); }
        return true;
      }),
    );
    li.append(buttons);
    return li;
  }

  o.input.addEventListener('change', () => {
    const files = [...o.input.files];
    o.input.value = '';
    if (files.length) add(files);
  });
  return { load, add };
}
