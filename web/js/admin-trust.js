// /admin's "Trust this box" section (only when the box serves https with its own CA): the CA
// certificate's download, its link as a QR code for a phone, and the fingerprint to check.
import { apiFetch } from './api.js';

const $ = (id) => document.getElementById(id);

async function load() {
  const res = await apiFetch('admin/trust');
  if (!res.ok) return; // 404 no_box_ca: the operator's own certificate, or plain http
  const body = await res.json();
  $('trust-url').value = body.url;
  $('trust-fingerprint').textContent = body.fingerprint;
  // The server's own SVG (segno), made from the link: markup we generated, not anyone's text.
  $('trust-qr').innerHTML = body.qr_svg;
  $('trust-admin').hidden = false;
}
load();
