// The status page (/admin): polls admin/status every few seconds and draws the now tiles,
// inline SVG charts of the last hour or day, and the usage table. Counts only: the JSON
// carries no message text. Everything is written with textContent / SVG attributes.
import { apiFetch } from './api.js';

const POLL_MS = 3000;
const SVG = 'http://www.w3.org/2000/svg';
const W = 300, H = 100, PAD = 2;
let range = 'hour';
let last = null;

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined ? '–' : Number(n).toLocaleString());
const mib = (b) => `${fmt(Math.round((b || 0) / 2 ** 20))} MiB`;

function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  return d ? `${d} d ${h} h` : h ? `${h} h ${m} min` : `${m} min ${Math.floor(s % 60)} s`;
}

function tiles(now) {
  const mem = now.memory, heat = now.thermal;
  return [
    ['Model', `${now.model}${now.quant ? ` (${now.quant})` : ''}`],
    ['Up for', duration(now.uptime_s)],
    ['Slots busy', `${now.slots.busy} of ${now.slots.total}`],
    ['Queue', now.queue ? `${now.queue} (wait ~${now.wait_s ?? '?'} s)` : '0'],
    ['Tokens/s', fmt(now.tokens_per_s)],
    ['Tokens generated', fmt(now.generated_tokens)],
    ['Active clients (5 min)', fmt(now.active_clients)],
    ['Memory (RSS)', mib(mem.rss_bytes)],
    ['Parked sessions', `${mib(mem.parked_bytes)} of ${mib(mem.park_budget_bytes)}`],
    ['Memory available', mib(mem.available_bytes)],
    ['CPU temperature', heat.max_c === null ? '–' : `${heat.max_c.toFixed(0)} °C`, heat.throttled],
    ['Throttled', heat.throttled ? 'yes' : 'no', heat.throttled],
    ['Watchdog', now.watchdog.ok ? 'ok' : `stalled ${now.watchdog.stalled_s} s`, !now.watchdog.ok],
  ];
}

function drawNow(now) {
  const dl = $('now');
  dl.replaceChildren(...tiles(now).map(([name, value, hot]) => {
    const div = document.createElement('div');
    const dt = document.createElement('dt'), dd = document.createElement('dd');
    dt.textContent = name;
    dd.textContent = value;
    if (hot) dd.classList.add('hot');
    div.append(dt, dd);
    return div;
  }));
  const state = $('state');
  state.textContent = now.state;
  state.className = `badge ${now.state === 'ok' ? 'ok' : 'bad'}`;
}

function el(name, attrs) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// One chart: each series a polyline over the same x axis, scaled to the largest value.
function chart(title, unit, series, t) {
  const values = series.flatMap((s) => s.values.filter((v) => v !== null));
  const top = Math.max(1e-9, ...values);
  const n = t.length;
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img',
                          'aria-label': `${title}, at most ${fmt(Math.round(top * 100) / 100)} ${unit}` });
  svg.append(el('line', { class: 'axis', x1: 0, y1: H - PAD, x2: W, y2: H - PAD }));
  series.forEach((s, k) => {
    const pts = s.values.map((v, i) => `${(i / Math.max(1, n - 1)) * W},${H - PAD - ((v ?? 0) / top) * (H - 2 * PAD)}`);
    svg.append(el('polyline', { class: `s${k}`, points: pts.join(' '), 'vector-effect': 'non-scaling-stroke' }));
  });
  const fig = document.createElement('figure');
  fig.className = 'chart';
  const cap = document.createElement('figcaption');
  const name = document.createElement('span');
  name.textContent = title;
  const legend = document.createElement('span');
  series.forEach((s, k) => {
    const item = document.createElement('span');
    item.className = `legend${k}`;
    const latest = s.values.filter((v) => v !== null).at(-1);
    item.textContent = ` ${s.name} ${latest === undefined ? '–' : fmt(Math.round(latest * 100) / 100)}`;
    legend.append(item);
  });
  cap.append(name, legend);
  fig.append(cap, svg);
  return fig;
}

function drawCharts(data) {
  const s = data[range];
  const per = range === 'hour' ? 'minute' : '10 minutes';
  $('charts').replaceChildren(
    chart(`Requests per ${per}`, 'requests', [{ name: 'requests', values: s.requests }], s.t),
    chart('Generated tokens/s', 'tokens/s', [{ name: 'tokens/s', values: s.tokens_per_s }], s.t),
    chart('Time to first token (s)', 's', [{ name: 'p50', values: s.ttft_p50 }, { name: 'p95', values: s.ttft_p95 }], s.t),
    chart(`Refusals and errors per ${per}`, 'requests',
          [{ name: 'refused', values: s.refusals }, { name: 'errors', values: s.errors }], s.t),
  );
}

const COUNTS = ['requests', 'prompt_tokens', 'cached_tokens', 'generated_tokens', 'refusals'];

function drawPeople(people, persistent) {
  $('people').tBodies[0].replaceChildren(...people.map((p) => {
    const tr = document.createElement('tr');
    tr.dataset.who = p.who;
    if (p.at_limit) tr.className = 'at-limit';
    const cells = [p.who, ...COUNTS.map((c) => fmt(p.today[c])), ...COUNTS.map((c) => fmt(p.week[c])),
                   p.quota ? `${fmt(p.quota)}${p.at_limit ? ' (reached)' : ''}` : 'none'];
    cells.forEach((text, i) => {
      const td = document.createElement(i ? 'td' : 'th');
      if (!i) td.scope = 'row';
      td.textContent = text;
      tr.append(td);
    });
    return tr;
  }));
  $('people-empty').hidden = people.length > 0;
  $('memory-only').hidden = persistent;
}

async function poll() {
  try {
    const res = await apiFetch('admin/status');
    if (!res.ok) throw new Error(res.status === 403 ? 'only from this machine or with an admin key' : `HTTP ${res.status}`);
    last = await res.json();
    drawNow(last.now);
    drawCharts(last);
    drawPeople(last.people, last.persistent);
    $('updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.documentElement.dataset.ready = '1';  // drawn once (the browser tests wait for it)
  } catch (e) {
    const state = $('state');
    state.textContent = `unreachable: ${e.message}`;
    state.className = 'badge bad';
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function pick(which) {
  range = which;
  $('range-hour').setAttribute('aria-pressed', String(which === 'hour'));
  $('range-day').setAttribute('aria-pressed', String(which === 'day'));
  if (last) drawCharts(last);
}

$('range-hour').addEventListener('click', () => pick('hour'));
$('range-day').addEventListener('click', () => pick('day'));
poll();
