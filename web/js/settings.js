// Settings kept in this browser, the theme, and the API key asked for after a 401.
import { apiKey } from './api.js';
import { askUser, el, els } from './page.js';
import { peopleModule } from './people-load.js';
import { people } from './who.js';

const SETTINGS_KEY = 'chat.settings.v1';
let presets = new Map(); // name -> text, from GET /v1/system_prompts
function loadSettings() {
  let s = {};
  try { s = JSON.parse(localStorage.getItem(SETTINGS_KEY)) || {}; } catch { /* defaults */ }
  if (s.preset === undefined) s.preset = s.system ? 'custom' : ''; // the page before presets
  return {
    preset: String(s.preset || ''), presetText: String(s.presetText || ''), system: String(s.system || ''),
    temperature: s.temperature ?? '', maxTokens: s.maxTokens ?? '', theme: s.theme || '',
  };
}
export const settings = loadSettings();
function saveSettings() {
  try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings)); } catch { /* this page only */ }
}
export function systemPrompt() {
  if (settings.preset === 'custom') return settings.system.trim();
  if (settings.preset) return presets.get(settings.preset) ?? settings.presetText;
  return '';
}
function showSettings() {
  els.preset.value = settings.preset;
  if (els.preset.value !== settings.preset) els.preset.value = ''; // a preset the server dropped
  els.system.value = settings.system;
  els.temperature.value = settings.temperature;
  els.maxTokens.value = settings.maxTokens;
  els.themeSelect.value = settings.theme;
  syncPresetFields();
  const key = apiKey.get();
  els.keyState.textContent = key ? `set (…${key.slice(-4)})` : 'none';
  els.forgetKey.hidden = !key;
  els.keyRow.hidden = people.mode === 'people';
  els.account.hidden = true;
  if (people.mode === 'people') peopleModule().then((m) => m.showAccount());
}
function syncPresetFields() {
  const p = els.preset.value;
  els.system.hidden = p !== 'custom';
  els.presetText.hidden = !p || p === 'custom';
  els.presetText.textContent = presets.get(p) || '';
}
function readSettings() {
  settings.preset = els.preset.value;
  settings.presetText = presets.get(settings.preset) || '';
  settings.system = els.system.value;
  settings.temperature = els.temperature.value;
  settings.maxTokens = els.maxTokens.value;
  syncPresetFields();
  saveSettings();
}
for (const e of [els.preset, els.system, els.temperature, els.maxTokens]) {
  e.addEventListener('input', readSettings);
  e.addEventListener('change', readSettings);
}
els.openSettings.addEventListener('click', () => { showSettings(); els.settings.showModal(); });
els.forgetKey.addEventListener('click', () => { apiKey.clear(); showSettings(); });

const THEMES = ['', 'light', 'dark'];
const THEME_NAMES = { '': 'follows the system', light: 'light', dark: 'dark' };
export function applyTheme(t) {
  settings.theme = THEMES.includes(t) ? t : '';
  if (settings.theme) document.documentElement.dataset.theme = settings.theme;
  else delete document.documentElement.dataset.theme;
  els.theme.setAttribute('aria-label', `Theme: ${THEME_NAMES[settings.theme]} (switch)`);
  els.theme.title = els.theme.getAttribute('aria-label');
  els.themeSelect.value = settings.theme;
  saveSettings();
}
els.theme.addEventListener('click', () => applyTheme(THEMES[(THEMES.indexOf(settings.theme) + 1) % THEMES.length]));
els.themeSelect.addEventListener('change', () => applyTheme(els.themeSelect.value));

let keyPrompt = null;
// Asks for a key after a 401; resolves true when one was entered. One question at a time.
export function askKey() {
  if (people.mode === 'people') return peopleModule().then((m) => m.signInAgain());
  if (!keyPrompt) {
    const had = apiKey.get();
    keyPrompt = askUser({
      title: 'API key needed',
      text: had ? 'The server did not accept the key. Enter another one (it is kept in this browser).'
        : 'This server asks for an API key. Enter yours (it is kept in this browser).',
      type: 'password', ok: 'Use key',
    }).then((k) => {
      keyPrompt = null;
      if (k && k.trim()) { apiKey.set(k.trim()); return true; }
      return false;
    });
  }
  return keyPrompt;
}

// The operator's presets (GET /v1/system_prompts' data) as options of the select.
export function setPresets(data) {
  presets = new Map((data || []).filter((x) => x && typeof x.name === 'string').map((x) => [x.name, String(x.text || '')]));
  for (const o of [...els.preset.options]) if (o.dataset.preset) o.remove();
  for (const name of presets.keys()) {
    const o = el('option', null, `Preset: ${name}`);
    o.value = name;
    o.dataset.preset = '1';
    els.preset.append(o);
  }
}
