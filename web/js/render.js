// Model text -> sanitized DOM: Markdown (marked), sanitizing (DOMPurify), code highlighting
// (highlight.js). The three are classic scripts from web/vendor/, loaded before this module.
// Raw HTML in the text is shown as text, never parsed; links open in a new tab without a
// referrer; images become links (no request leaves the page, and the CSP would block them).
const { marked, DOMPurify, hljs } = window;

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);

// Highlighting a grown code block again on every frame of a stream is the main cost of
// rendering; finished blocks come from this cache (key: language, NUL, code).
const hlCache = new Map();
const HL_CACHE_MAX = 200;
const AUTO_MAX_CHARS = 10000; // guessing the language runs every grammar: only for short blocks

function highlight(code, lang, final) {
  const key = `${lang}\0${code}`;
  let out = hlCache.get(key);
  if (out !== undefined) return out;
  out = null;
  try {
    if (lang && hljs.getLanguage(lang)) out = hljs.highlight(code, { language: lang, ignoreIllegals: true });
    else if (!lang && final && code.length <= AUTO_MAX_CHARS) out = hljs.highlightAuto(code);
  } catch { /* plain text */ }
  const result = out ? { html: out.value, lang: lang || out.language || '' } : { html: escapeHtml(code), lang };
  if (out || final) {
    if (hlCache.size >= HL_CACHE_MAX) hlCache.delete(hlCache.keys().next().value);
    hlCache.set(key, result);
  }
  return result;
}

function makeMarked(final) {
  return new marked.Marked({
    gfm: true,
    breaks: false,
    async: false,
    renderer: {
      html(token) { return escapeHtml(token.text); },
      image(token) {
        const label = escapeHtml(token.text || token.href || 'image');
        return token.href ? `<a href="${escapeHtml(token.href)}">${label}</a>` : label;
      },
      code(token) {
        const lang = ((token.lang || '').match(/^[\w+#.-]*/) || [''])[0].toLowerCase();
        const code = token.text.replace(/\n$/, '');
        const { html, lang: shown } = highlight(code, lang, final);
        const cls = shown ? ` class="hljs language-${escapeHtml(shown)}"` : ' class="hljs"';
        return `<pre><code${cls}>${html}</code></pre>\n`;
      },
    },
  });
}
const streamingMd = makeMarked(false);
const finalMd = makeMarked(true);

const PURIFY = {
  // Nothing that loads, submits, styles or scripts: text, structure, links.
  FORBID_TAGS: ['style', 'img', 'svg', 'math', 'form', 'input', 'button', 'textarea', 'select', 'option',
    'iframe', 'frame', 'object', 'embed', 'video', 'audio', 'source', 'picture', 'link', 'meta', 'base'],
  FORBID_ATTR: ['style', 'id', 'name', 'srcset', 'action', 'formaction'],
  ALLOW_DATA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    if (node.hasAttribute('href')) {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
  } else if (node.hasAttribute('target')) {
    node.removeAttribute('target');
  }
});

function codeBlock(pre) {
  const code = pre.querySelector('code');
  const lang = code && (/language-([\w+#.-]+)/.exec(code.className) || [])[1];
  const wrap = document.createElement('div');
  wrap.className = 'code';
  const bar = document.createElement('div');
  bar.className = 'code-bar';
  const label = document.createElement('span');
  label.textContent = lang || 'text';
  const copy = document.createElement('button');
  copy.type = 'button';
  copy.className = 'mini';
  copy.dataset.copy = 'code';
  copy.textContent = 'Copy';
  copy.setAttribute('aria-label', `Copy ${lang || ''} code`.replace('  ', ' '));
  bar.append(label, copy);
  pre.replaceWith(wrap);
  wrap.append(bar, pre);
}

// Renders Markdown into target (replacing its children). final: the text is complete
// (guess languages of untagged code blocks).
export function renderMarkdown(target, text, final = true) {
  const html = (final ? finalMd : streamingMd).parse(text);
  const frag = DOMPurify.sanitize(html, PURIFY);
  for (const pre of frag.querySelectorAll('pre')) codeBlock(pre);
  for (const table of frag.querySelectorAll('table')) {
    const wrap = document.createElement('div');
    wrap.className = 'table-wrap';
    table.replaceWith(wrap);
    wrap.append(table);
  }
  target.replaceChildren(frag);
}

// The user's own words: shown exactly as typed.
export function renderPlain(target, text) {
  target.textContent = text;
}
