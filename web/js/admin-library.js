// /admin's Library section: the office's documents, which every chat with "Answer from the
// library" on may answer from. Listed with their indexing progress, added, replaced, deleted.
import { started } from './admin-people.js';
import { shelf } from './library.js';

const $ = (id) => document.getElementById(id);
const office = shelf({
  base: 'admin/library', list: $('lib-list'), empty: $('lib-empty'), error: $('lib-error'), input: $('lib-file'),
  confirm: async (text) => window.confirm(text),
});
started.then(async () => { if (await office.load()) $('library-admin').hidden = false; }); // not an admin: no section
