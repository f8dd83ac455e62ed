// /admin's People section (people mode only): add a person (an invite link and its QR code),
// a new link, disable or enable, remove with everything of theirs. Names and counts only.
import { apiFetch, readError, setCsrf } from './api.js';

const $ = (id) => document.getElementById(id);

async function call(path, method = 'GET', body) {
  const res = await apiFetch(path, {
    method, headers: body ? { 'Content-Type': 'application/json' } : {}, body: body ? JSON.stringify(body) : undefined,
  });
  if (!res.ok) throw new Error((await readError(res)).message);
  return res.status === 204 ? null : res.json();
}

function problem(e) {
  $('people-error').textContent = e ? e.message : '';
  $('people-error').hidden = !e;
}

function showInvite(name, body) {
  $('invite').hidden = false;
  $('invite-name').textContent = name;
  $('invite-url').value = body.invite_url;
  // The server's own SVG (segno), made from the link: markup we generated, not anyone's text.
  $('invite-qr').innerHTML = body.invite_qr_svg;
}

function action(label, fn, danger = false) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = `mini${danger ? ' danger' : ''}`;
  b.textContent = label;
  b.addEventListener('click', async () => {
    problem(null);
    try { await fn(); } catch (e) { problem(e); }
    refresh();
  });
  return b;
}

function row(p) {
  const tr = document.createElement('tr');
  const cells = [p.name, p.role, p.quota ?? 'default', p.chats, p.keys, p.sessions,
    p.disabled ? 'disabled' : p.invited ? 'invited' : 'active'];
  for (const c of cells) {
    const td = document.createElement('td');
    td.textContent = String(c);
    tr.append(td);
  }
  const td = document.createElement('td');
  const id = encodeURIComponent(p.id);
  td.append(
    action('New invite link', async () => showInvite(p.name, await call(`admin/people/${id}/invite`, 'POST'))),
    action('Delete chats', async () => {
      if (window.confirm(`Delete all of ${p.name}'s chats? They cannot be brought back.`)) await call(`admin/people/${id}?only=chats`, 'DELETE');
    }, true),
    action(p.disabled ? 'Enable' : 'Disable', () => call(`admin/people/${id}`, 'PATCH', { disabled: !p.disabled })),
    action('Remove', async () => {
      if (window.confirm(`Remove ${p.name} and all their chats and keys?`)) await call(`admin/people/${id}`, 'DELETE');
    }, true),
  );
  tr.append(td);
  return tr;
}

async function refresh() {
  let body;
  try { body = await call('admin/people'); } catch { return; } // open mode: no section
  $('people-admin').hidden = false;
  $('accounts').tBodies[0].replaceChildren(...body.people.map(row));
}

$('add-person').addEventListener('submit', async (e) => {
  e.preventDefault();
  problem(null);
  const name = $('person-name').value.trim();
  const quota = $('person-quota').value === '' ? null : Number($('person-quota').value);
  try {
    showInvite(name, await call('admin/people', 'POST', { name, role: $('person-role').value, quota }));
    $('person-name').value = '';
  } catch (err) { problem(err); }
  refresh();
});
$('invite-copy').addEventListener('click', () => {
  $('invite-url').select();
  if (navigator.clipboard) navigator.clipboard.writeText($('invite-url').value).catch(() => document.execCommand('copy'));
  else document.execCommand('copy');
});

async function start() {
  try { setCsrf((await (await fetch('auth/me', { cache: 'no-store' })).json()).csrf); } catch { /* from this machine */ }
  refresh();
}
export const started = start(); // admin-library.js waits for the CSRF token too
