// People mode: signs in, takes an invite (#invite=TOKEN: a fragment is never sent to a server
// or written to a log), opens a shared chat (#share=TOKEN); the account part of Settings: sign
// out here or everywhere, the password, and the person's own API keys for their tools.
// Loaded only in people mode (who.js says which).
import { apiFetch, readError, setCsrf } from './api.js';
import { shelf } from './library.js';
import { askUser, el, els, toast } from './page.js';
import { fragment, people } from './who.js';

function dropFragment(name) {
  const p = new URLSearchParams(location.hash.slice(1));
  p.delete(name);
  history.replaceState(null, '', location.pathname + location.search + (p.toString() ? `#${p}` : ''));
}

// Tokens travel in request bodies, never in a path a proxy or an access log keeps.
async function inviteFor(token) {
  const res = await fetch('auth/invite', {
    method: 'POST', cache: 'no-store', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token }),
  });
  return res.ok ? (await res.json()).name : null;
}

function plainHttpWarning() {
  const local = ['localhost', '127.0.0.1', '[::1]'].includes(location.hostname);
  els.signinPlain.hidden = location.protocol !== 'http:' || local;
  if (location.protocol === 'https:') showFingerprint();
}

// The box's own CA (GET /trust; 404 with the operator's certificate): its fingerprint to compare.
async function showFingerprint() {
  const res = await fetch('trust', { cache: 'no-store' });
  if (!res.ok) return;
  els.signinFingerprint.textContent = (await res.json()).fingerprint;
  els.signinTrust.hidden = false;
}

// Resolves once someone is signed in; the chat stays hidden until then.
export async function signIn(why = '') {
  const token = fragment('invite');
  const invited = token ? await inviteFor(token) : null;
  els.app.hidden = true;
  els.signin.hidden = false;
  plainHttpWarning();
  els.signinTitle.textContent = invited ? `Welcome, ${invited}` : 'Sign in';
  els.signinText.textContent = invited ? 'Choose a password (at least 8 characters) to finish your account.'
    : (token ? 'This invite link is not valid any more: ask for a new one, or sign in.' : why);
  els.signinText.hidden = !els.signinText.textContent;
  els.signinNameRow.hidden = !!invited;
  els.signinName.value = invited || els.signinName.value;
  els.signinPassword.autocomplete = invited ? 'new-password' : 'current-password';
  els.signinPassword.minLength = invited ? 8 : 0;
  els.signinGo.textContent = invited ? 'Set password and sign in' : 'Sign in';
  (invited ? els.signinPassword : els.signinName).focus();
  return new Promise((resolve) => {
    els.signinForm.onsubmit = async (e) => {
      e.preventDefault();
      els.signinError.hidden = true;
      els.signinGo.disabled = true;
      try {
        const body = await submitSignIn(invited ? token : null);
        if (!body) return;
        if (invited) dropFragment('invite');
        people.person = body.person;
        setCsrf(body.csrf);
        els.signinPassword.value = '';
        els.signin.hidden = true;
        els.app.hidden = false;
        resolve(people);
      } finally {
        els.signinGo.disabled = false;
      }
    };
  });
}

let again = null;
// After a 401 (signed out elsewhere, or disabled): the sign-in form again, one at a time;
// resolves true once signed in, as settings.js's askKey does with a key.
export function signInAgain() {
  again = again || signIn('Your sign-in has ended. Sign in again to go on.').then(() => { again = null; return true; });
  return again;
}

async function submitSignIn(invite) {
  const password = els.signinPassword.value;
  const res = await fetch(invite ? 'auth/invite/accept' : 'auth/signin', {
    method: 'POST', cache: 'no-store', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(invite ? { token: invite, password } : { name: els.signinName.value.trim(), password }),
  });
  if (res.ok) return res.json();
  const err = await readError(res);
  els.signinError.textContent = res.status === 401 ? 'Wrong name or password.'
    : res.status === 429 ? `Too many tries. Wait ${err.retryAfter || 60} seconds and try again.` : err.message;
  els.signinError.hidden = false;
  els.signinPassword.select();
  return null;
}

// -- Settings: the account ---------------------------------------------------------------------
export function showAccount() {
  els.account.hidden = people.mode !== 'people' || !people.person;
  els.keyRow.hidden = people.mode === 'people';
  if (els.account.hidden) return;
  els.accountName.textContent = people.person.name;
  listKeys();
  els.myDocs.hidden = els.libraryRow.hidden; // no library on this box (or none reachable): no section
  if (!els.myDocs.hidden) mine.load();
}

// My documents: the person's own part of the library (the office's is the operator's, in /admin).
const mine = shelf({
  base: 'v1/library', list: els.docList, empty: els.docsEmpty, error: els.docError, input: els.docFile,
  keep: (d) => d.scope === 'own', askKey: signInAgain,
  confirm: (text) => askUser({ title: 'Delete this document?', text, type: null, ok: 'Delete', danger: true }),
});
els.addDoc.addEventListener('click', () => els.docFile.click());
els.myDocs.addEventListener('drop', (e) => { // dropped here, not on the message
  if (!e.dataTransfer || !e.dataTransfer.files.length) return;
  e.preventDefault();
  e.stopPropagation();
  els.composer.classList.remove('drop');
  mine.add(e.dataTransfer.files);
});

async function post(path, body, method = 'POST') {
  const res = await apiFetch(path, {
    method, headers: { 'Content-Type': 'application/json' }, body: body ? JSON.stringify(body) : undefined,
  });
  if (!res.ok) throw new Error((await readError(res)).message);
  return res.status === 204 ? null : res.json();
}

async function signOut(everywhere) {
  try { await post(everywhere ? 'auth/signout-everywhere' : 'auth/signout'); } catch (e) { toast(e.message); return; }
  location.reload();
}
els.signOut.addEventListener('click', () => signOut(false));
els.signOutEverywhere.addEventListener('click', () => signOut(true));

els.changePassword.addEventListener('click', async () => {
  els.settings.close();
  const current = await askUser({ title: 'Change password', text: 'Your current password:', type: 'password', ok: 'Next' });
  if (!current) return;
  const next = await askUser({ title: 'Change password', text: 'The new password (at least 8 characters). Your other devices will be signed out.', type: 'password', ok: 'Change' });
  if (!next) return;
  try {
    const body = await post('auth/password', { current, new: next });
    setCsrf(body.csrf);
    toast('Password changed. Your other devices are signed out.');
  } catch (e) { toast(`Could not change the password: ${e.message}`); }
});

async function listKeys() {
  let keys = [];
  try { keys = (await (await apiFetch('v1/me/keys')).json()).keys; } catch { /* shown empty */ }
  els.keyList.replaceChildren(...keys.map((k) => {
    const li = el('li', null, `${k.label} `);
    const b = el('button', 'mini', 'Revoke');
    b.type = 'button';
    b.addEventListener('click', async () => {
      try { await post(`v1/me/keys/${encodeURIComponent(k.id)}`, null, 'DELETE'); } catch (e) { toast(e.message); }
      listKeys();
    });
    li.append(b);
    return li;
  }));
  els.keysEmpty.hidden = keys.length > 0;
}
els.newKey.addEventListener('click', async () => {
  els.settings.close();
  const label = await askUser({ title: 'New API key', text: 'What is it for (a name for you)?', value: 'my tool', ok: 'Make key' });
  if (!label) return;
  try {
    const body = await post('v1/me/keys', { label });
    await askUser({ title: 'Your new API key', text: 'Copy it now: it is not shown again. Tools send it as "Authorization: Bearer KEY"; what they use counts as yours.', value: body.key, ok: 'Done' });
  } catch (e) { toast(`Could not make a key: ${e.message}`); }
});

// -- Sharing -----------------------------------------------------------------------------------
export async function shareChat(chat) {
  try {
    const body = await post(`v1/chats/${encodeURIComponent(chat.id)}/share`);
    chat.shared = true;
    await askUser({ title: 'Share link', text: 'People signed in to this box can read this chat with the link (not change it). Stop sharing in the ⋯ menu.', value: body.url, ok: 'Done' });
  } catch (e) { toast(`Could not share: ${e.message}`); }
}
export async function unshareChat(chat) {
  try { await post(`v1/chats/${encodeURIComponent(chat.id)}/share`, null, 'DELETE'); chat.shared = false; toast('The link no longer works.'); } catch (e) { toast(e.message); }
}

// A chat someone shared: read-only, not in the list.
export async function sharedChat(token) {
  const res = await apiFetch('v1/shared', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token }),
  });
  if (!res.ok) { toast('This shared chat is not there any more (the link may have been revoked).'); return null; }
  const c = await res.json();
  return {
    id: `shared-${token.slice(0, 8)}`, sid: '', title: `${c.title} (shared by ${c.owner})`, readOnly: true,
    created: c.created * 1000, updated: c.updated * 1000,
    messages: c.messages.map((m) => ({ ...(m.meta || {}), role: m.role, content: m.content })),
  };
}
