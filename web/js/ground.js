// The figures and names a library answer's check found in no source (its `grounding`'s
// `unsupported`), marked in the answer's rendered text: in the DOM's text nodes, after Markdown
// and DOMPurify, so nothing the server sent becomes markup. Loaded by messages.js with the
// first answer that has one (the page's weight).

const escape = (w) => w.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

// Each of `words` (as the answer wrote them: "14", "£160", "Kestrel") in root's text, outside
// buttons, becomes <mark class="unsupported">. Only whole: no Latin letter or digit beside it
// ("14" is not in "140" nor "1,014"), while CJK may touch it ("14天").
export function markUnsupported(root, words) {
  const list = [...new Set(words)].sort((a, b) => b.length - a.length).map(escape);
  if (!list.length) return;
  const re = new RegExp(`(?<![A-Za-z0-9]|\\d[.,])(?:${list.join('|')})(?![A-Za-z0-9]|[.,]\\d)`, 'gi');
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const hits = [];
  for (let t; (t = walk.nextNode());) if (t.data.search(re) >= 0 && !t.parentElement.closest('button, mark')) hits.push(t);
  for (const t of hits) {
    const parts = [];
    let at = 0;
    for (const m of t.data.matchAll(re)) {
      parts.push(t.data.slice(at, m.index), unsupported(m[0]));
      at = m.index + m[0].length;
    }
    t.replaceWith(...parts, t.data.slice(at));
  }
}

// A mark says what it means to a pointer (title) and to a screen reader (hidden text).
function unsupported(text) {
  const m = document.createElement('mark');
  m.className = 'unsupported';
  m.title = "Not found in the library's sources";
  const said = document.createElement('span');
  said.className = 'sr-only';
  said.textContent = ' (not in the library)';
  m.append(text, said);
  return m;
}
