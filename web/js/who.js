// Who is at the keyboard, as the server says (GET auth/me): open mode, or people mode and the
// person signed in. Small and always loaded; people.js (sign-in, account, sharing; through
// people-load.js) and serverstore.js are loaded only in people mode, so open mode's page weighs
// what it did.
import { setCsrf } from './api.js';

export const people = { mode: 'open', person: null, saving: true };

export async function whoAmI() {
  let body = {};
  try { body = await (await fetch('auth/me', { cache: 'no-store' })).json(); } catch { /* open */ }
  people.mode = body.mode || 'open';
  people.person = body.person || null;
  people.saving = !body.store || body.store.saving !== false;
  setCsrf(body.csrf || '');
  return people;
}

export const fragment = (name) => new URLSearchParams(location.hash.slice(1)).get(name);
