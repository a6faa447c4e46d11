// The dashboard: every sandbox of the daemon as a card with a live
// thumbnail, and the few operations a person wants from a browser (open or
// watch the live view, extend, destroy). It talks to the REST API with the
// key the user typed, kept in sessionStorage only: gone with the tab, never
// in a URL, never in localStorage.
//
// For automated tests: each card is <article class="sandbox" data-id
// data-state> holding an <img class="thumb"> once a thumbnail loaded, and
// a <dl class="usage" data-cpu-percent data-memory-bytes> once the
// sandbox's figures came; the sign-in form is #signin with the input
// #api-key; document.body.dataset.view is loading | signin | sandboxes.

const $ = (id) => document.getElementById(id);

const storageKey = 'cubicle.apiKey';
const listEveryMs = 5000;
const thumbEveryMs = 2500;
const thumbQuery = 'format=jpeg&quality=50&scale=0.3';
const viewTTLSeconds = 3600;
const extendSeconds = 3600;

let apiKey = ''; // '' while signed out, and when the daemon runs without keys
let signedIn = false;
let clockOffset = 0; // server clock minus ours, from the Date header
let listTimer = 0;
let thumbTimer = 0;
let lastRefreshError = '';

// cards holds the card of each listed sandbox by id, with its thumbnail
// state; cards are kept across refreshes so thumbnails do not flicker.
const cards = new Map();

class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// api calls the REST API and returns the Response, or throws an APIError
// carrying the API's error message. A 401 while signed in signs out: the
// key was revoked or the daemon restarted with other keys.
async function api(method, path, { body, key = apiKey, accept = 'application/json', passive = false } = {}) {
  // Accept matters: the screenshot endpoint answers JSON (base64) to
  // application/json and the image itself otherwise.
  const headers = { Accept: accept };
  // Watching is not using: passive requests do not restart a sandbox's
  // idle timer, so an open dashboard keeps nothing alive.
  if (passive) headers['X-Cubicle-Passive'] = '1';
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch {
    throw new APIError(0, 'unreachable', 'The daemon cannot be reached.');
  }
  const date = Date.parse(res.headers.get('Date') || '');
  if (!Number.isNaN(date)) clockOffset = date - Date.now();
  if (res.ok) return res;
  let code = '';
  let message = `HTTP ${res.status} ${res.statusText}`.trim();
  try {
    const b = await res.json();
    if (b && b.error) {
      code = b.error.code || '';
      message = b.error.message || message;
    }
  } catch {
    // not an API error body; keep the status line
  }
  if (res.status === 401 && signedIn && key === apiKey) {
    signOut('The daemon no longer accepts this API key — sign in again.');
  }
  throw new APIError(res.status, code, message);
}

async function apiJSON(method, path, opts) {
  const res = await api(method, path, opts);
  return res.status === 204 ? null : res.json();
}

const sandboxPath = (id) => `/v1/sandboxes/${encodeURIComponent(id)}`;

// ---- signing in and out ----

function show(view) {
  document.body.dataset.view = view;
  $('loading').hidden = view !== 'loading';
  $('signin').hidden = view !== 'signin';
  $('sandboxes').hidden = view !== 'sandboxes';
}

function showSignIn(error = '') {
  show('signin');
  $('signout').hidden = true;
  $('daemon-info').textContent = '';
  $('capacity').textContent = '';
  const e = $('signin-error');
  e.textContent = error;
  e.hidden = !error;
  $('api-key').focus();
}

async function start() {
  let saved = '';
  try {
    saved = sessionStorage.getItem(storageKey) || '';
  } catch {
    // storage disabled: the user signs in for this page only
  }
  try {
    // Without a saved key this asks whether the daemon wants one at all: a
    // loopback daemon without keys answers 200 and the form is skipped.
    const info = await apiJSON('GET', '/v1/info', { key: saved });
    enter(saved, info);
  } catch (err) {
    if (err.status === 401) {
      forgetKey();
      showSignIn(saved ? 'The saved key is no longer accepted — sign in again.' : '');
    } else {
      showSignIn(err.message);
    }
  }
}

async function onSignIn(e) {
  e.preventDefault();
  const input = $('api-key');
  const key = input.value.trim();
  if (!key) return;
  const button = e.submitter || $('signin').querySelector('button');
  button.disabled = true;
  try {
    const info = await apiJSON('GET', '/v1/info', { key });
    input.value = '';
    enter(key, info);
  } catch (err) {
    showSignIn(err.status === 401 ? 'Wrong key — the daemon did not accept it.' : err.message);
    input.select();
  } finally {
    button.disabled = false;
  }
}

function enter(key, info) {
  apiKey = key;
  signedIn = true;
  if (key) {
    try {
      sessionStorage.setItem(storageKey, key);
    } catch {
      // kept in memory for this page only
    }
  }
  // With auth off there is nothing to sign out of.
  $('signout').hidden = !key;
  show('sandboxes');
  renderInfo(info);
  lastRefreshError = '';
  refresh();
  clearInterval(listTimer);
  clearInterval(thumbTimer);
  listTimer = setInterval(() => {
    if (!document.hidden) refresh();
  }, listEveryMs);
  thumbTimer = setInterval(refreshThumbs, thumbEveryMs);
}

function forgetKey() {
  try {
    sessionStorage.removeItem(storageKey);
  } catch {
    // nothing stored
  }
}

function signOut(message = '') {
  signedIn = false;
  apiKey = '';
  forgetKey();
  clearInterval(listTimer);
  clearInterval(thumbTimer);
  for (const card of cards.values()) dropCard(card);
  cards.clear();
  $('grid').replaceChildren();
  showSignIn(message);
}

// ---- daemon info and the sandbox list ----

function renderInfo(info) {
  if (!info) return;
  const parts = [];
  if (info.version) parts.push(`cubicled ${info.version}`);
  if (info.default_backend) parts.push(`default backend ${info.default_backend}`);
  // The runtime programs of the backends that run: which runsc a host
  // runs matters for what its gvisor sandboxes can do.
  const runtime = (b) => (b.runtime ? `${b.runtime.name} ${b.runtime.version || '(version unknown)'}` : '');
  for (const b of info.backends || []) {
    if (b.available && b.runtime) parts.push(`${b.name}: ${runtime(b)}`);
  }
  const di = $('daemon-info');
  di.textContent = parts.join(' · ');
  di.title = (info.backends || [])
    .map((b) => `${b.name}${b.runtime ? ` (${runtime(b)})` : ''}: ${b.available ? 'available' : `unavailable${b.reason ? ` (${b.reason})` : ''}`}`)
    .join('\n');
  const c = info.capacity;
  if (c) {
    $('capacity').textContent = c.max_sandboxes
      ? `${c.running} of ${c.max_sandboxes} sandboxes running`
      : `${c.running} sandboxes running`;
  }
}

let refreshing = false;

async function refresh() {
  // A slow daemon must not pile up list requests.
  if (!signedIn || refreshing) return;
  refreshing = true;
  try {
    const [list, info] = await Promise.all([
      apiJSON('GET', '/v1/sandboxes'),
      apiJSON('GET', '/v1/info'),
    ]);
    if (!signedIn) return;
    lastRefreshError = '';
    renderInfo(info);
    renderList((list && list.sandboxes) || []);
    refreshUsage();
  } catch (err) {
    // Every 5 s the same failure would bury the page in toasts: say it once.
    if (signedIn && err.message !== lastRefreshError) {
      lastRefreshError = err.message;
      toast(`Could not refresh: ${err.message}`, { error: true });
    }
  } finally {
    refreshing = false;
  }
}

function renderList(sandboxes) {
  const seen = new Set();
  const created = (sb) => Date.parse(sb.created_at || '') || 0;
  sandboxes.sort((a, b) => created(b) - created(a) || a.id.localeCompare(b.id));
  const grid = $('grid');
  for (const sb of sandboxes) {
    seen.add(sb.id);
    let card = cards.get(sb.id);
    if (!card) {
      card = makeCard(sb.id);
      cards.set(sb.id, card);
    }
    updateCard(card, sb);
    grid.appendChild(card.el); // moves existing cards into list order
  }
  for (const [id, card] of cards) {
    if (!seen.has(id)) removeCard(card);
  }
  $('empty').hidden = sandboxes.length > 0;
  refreshThumbs();
}

// ---- cards ----

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function makeCard(id) {
  const card = { id, sandbox: null, busy: false, acting: false, removed: false, img: null, thumbURL: '' };
  const article = el('article', 'sandbox');
  article.dataset.id = id;
  card.el = article;

  card.thumbBox = el('div', 'thumb-box', 'No picture yet');
  card.thumbBox.setAttribute('aria-hidden', 'true');

  const head = el('div', 'sandbox-head');
  const h2 = el('h2');
  h2.append(el('code', '', id));
  card.state = el('span', 'state');
  head.append(h2, card.state);

  card.facts = el('dl', 'facts');
  card.usage = el('dl', 'facts usage');
  card.usage.setAttribute('aria-label', 'Resource use');
  card.usage.hidden = true;
  card.meta = el('ul', 'meta');
  card.meta.setAttribute('aria-label', 'Metadata');
  card.error = el('p', 'error');

  const actions = el('div', 'actions');
  const button = (label, onClick, className = '') => {
    const b = el('button', className, label);
    b.type = 'button';
    b.setAttribute('aria-label', `${label} (sandbox ${id})`);
    b.addEventListener('click', () => run(card, b, onClick));
    actions.append(b);
    return b;
  };
  card.open = button('Open live view', () => openView(card, false), 'primary');
  card.open.title = 'Open the desktop in a new tab, with your mouse and keyboard';
  card.watch = button('Watch', () => openView(card, true));
  card.watch.title = 'Open the desktop in a new tab, view only';
  card.extend = button('Extend 1 h', () => extend(card));
  card.extend.title = 'Set the sandbox to expire one hour from now';
  card.destroy = button('Destroy', () => destroy(card), 'danger');

  article.append(card.thumbBox, head, card.facts, card.usage, card.meta, card.error, actions);
  return card;
}

function updateCard(card, sb) {
  card.sandbox = sb;
  const state = sb.state || 'unknown';
  card.el.dataset.state = state;
  card.state.textContent = state;
  card.state.className = `state state-${state}`;

  const facts = [
    ['Backend', sb.backend + (sb.isolation ? ` (${sb.isolation})` : '')],
    ['Template', sb.template],
  ];
  if (sb.resolution && sb.resolution.width) {
    facts.push(['Screen', `${sb.resolution.width}×${sb.resolution.height}`]);
  }
  facts.push(['Created', relative(sb.created_at)]);
  facts.push(['Lifetime', expiryText(sb)]);
  card.facts.replaceChildren(...facts.flatMap(([k, v]) => [el('dt', '', k), el('dd', '', v || '—')]));

  const meta = Object.entries(sb.metadata || {});
  card.meta.replaceChildren(...meta.map(([k, v]) => el('li', 'mono', `${k}=${v}`)));
  card.meta.hidden = meta.length === 0;
  card.error.textContent = sb.error || '';
  card.error.hidden = !sb.error;
  // Figures are of a running sandbox only (a paused one uses nothing).
  if (state !== 'running') card.usage.hidden = true;

  setButtons(card);
}

function setButtons(card) {
  const state = card.sandbox ? card.sandbox.state : '';
  const running = state === 'running';
  const live = running || state === 'starting';
  card.open.disabled = card.acting || !running;
  card.watch.disabled = card.acting || !running;
  card.extend.disabled = card.acting || !live;
  card.destroy.disabled = card.acting || state === 'stopping';
}

function removeCard(card) {
  dropCard(card);
  cards.delete(card.id);
  card.el.remove();
}

function dropCard(card) {
  card.removed = true;
  if (card.thumbURL) URL.revokeObjectURL(card.thumbURL);
  card.thumbURL = '';
}

// run runs one card action with the card's buttons disabled, and shows its
// error, if any, in a toast.
async function run(card, button, action) {
  card.acting = true;
  setButtons(card);
  try {
    await action();
  } catch (err) {
    if (signedIn) toast(err.message, { error: true });
  } finally {
    card.acting = false;
    if (!card.removed) setButtons(card);
    button.focus({ preventScroll: true });
  }
}

async function openView(card, viewOnly) {
  const r = await apiJSON('POST', `${sandboxPath(card.id)}/view`, {
    body: { ttl_seconds: viewTTLSeconds, view_only: viewOnly },
  });
  const url = viewURL(r.url);
  window.open(url, '_blank', 'noopener');
  // With noopener, window.open says nothing about a blocked popup, so the
  // link is offered as well.
  const link = el('a', '', 'open it here');
  link.href = url;
  link.target = '_blank';
  link.rel = 'noopener noreferrer';
  toast(`${viewOnly ? 'Watching' : 'Live view of'} ${card.id} in a new tab — if none opened, `, { link });
}

// viewURL points a view link at this page's origin. The daemon builds the
// link from its own idea of its address, which behind a proxy or a port
// forward may not be the one this browser reached it by.
function viewURL(raw) {
  const u = new URL(raw, location.href);
  if (u.pathname.startsWith('/view/')) return location.origin + u.pathname + u.search;
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new APIError(0, '', 'The daemon returned an unusable view link.');
  return u.href;
}

async function extend(card) {
  const sb = await apiJSON('POST', `${sandboxPath(card.id)}/timeout`, {
    body: { timeout_seconds: extendSeconds },
  });
  if (sb && sb.id && !card.removed) {
    updateCard(card, sb);
    toast(`${card.id} now ${expiryText(sb)}.`);
  }
}

async function destroy(card) {
  if (!confirm(`Destroy sandbox ${card.id}? Everything in it is lost.`)) return;
  await api('DELETE', sandboxPath(card.id));
  if (!card.removed) removeCard(card);
  $('empty').hidden = cards.size > 0;
  toast(`Destroyed ${card.id}.`);
  refresh();
}

// ---- thumbnails ----

// refreshThumbs fetches a new thumbnail for each running sandbox whose last
// fetch is done, and only while the tab is visible: a hidden dashboard
// costs the daemon nothing.
function refreshThumbs() {
  if (!signedIn || document.hidden) return;
  for (const card of cards.values()) {
    if (!card.busy && card.sandbox && card.sandbox.state === 'running') loadThumb(card);
  }
}

async function loadThumb(card) {
  card.busy = true;
  let url = '';
  try {
    const res = await api('GET', `${sandboxPath(card.id)}/screenshot?${thumbQuery}`, { accept: 'image/jpeg', passive: true });
    const blob = await res.blob();
    if (card.removed) return;
    url = URL.createObjectURL(blob);
    // Decode off-screen first: a bad image must not replace a good one.
    const probe = new Image();
    probe.src = url;
    await probe.decode();
    if (card.removed) return;
    if (!card.img) {
      card.img = el('img', 'thumb');
      card.img.alt = `Screen of sandbox ${card.id}`;
      card.thumbBox.replaceChildren(card.img);
      card.thumbBox.removeAttribute('aria-hidden');
    }
    card.img.src = url;
    if (card.thumbURL) URL.revokeObjectURL(card.thumbURL);
    card.thumbURL = url;
    url = '';
  } catch {
    // A missed thumbnail is not worth a toast: the sandbox may just have
    // stopped, and the card's state will say so at the next refresh.
  } finally {
    if (url) URL.revokeObjectURL(url);
    card.busy = false;
  }
}

// ---- resource figures ----

// refreshUsage fetches the latest CPU and memory figures of each running
// sandbox, with the list (every 5 s, while the tab is visible). "since"
// is now, so the answer carries the latest sample and no history.
function refreshUsage() {
  if (!signedIn || document.hidden) return;
  for (const card of cards.values()) {
    if (!card.usageBusy && card.sandbox && card.sandbox.state === 'running') loadUsage(card);
  }
}

async function loadUsage(card) {
  card.usageBusy = true;
  try {
    const since = new Date(Date.now() + clockOffset).toISOString();
    const m = await apiJSON('GET', `${sandboxPath(card.id)}/metrics?since=${encodeURIComponent(since)}`, { passive: true });
    if (card.removed || !m || !m.latest) return;
    renderUsage(card, m.latest);
  } catch {
    // Like a missed thumbnail: the next refresh says what became of it.
  } finally {
    card.usageBusy = false;
  }
}

function renderUsage(card, s) {
  const pct = Math.max(0, Math.min(100, s.cpu.percent));
  const cpu = el('dd');
  const meter = el('meter');
  meter.min = 0;
  meter.max = 100;
  meter.value = pct;
  meter.setAttribute('aria-hidden', 'true');
  cpu.append(meter, ` ${pct.toFixed(pct < 10 ? 1 : 0)} % of ${s.cpu.count} CPU${s.cpu.count === 1 ? '' : 's'}`);
  const mem = s.memory.limit_bytes
    ? `${bytes(s.memory.used_bytes)} of ${bytes(s.memory.limit_bytes)}`
    : bytes(s.memory.used_bytes);
  card.usage.replaceChildren(el('dt', '', 'CPU'), cpu, el('dt', '', 'Memory'), el('dd', '', mem));
  card.usage.dataset.cpuPercent = String(s.cpu.percent);
  card.usage.dataset.memoryBytes = String(s.memory.used_bytes);
  card.usage.title = `sampled ${relative(s.timestamp)}`;
  card.usage.hidden = card.sandbox.state !== 'running';
}

function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i === 0 || n >= 100 ? 0 : 1)} ${units[i]}`;
}

// ---- small things ----

function relative(iso) {
  const t = Date.parse(iso || '');
  if (Number.isNaN(t)) return '';
  const d = t - (Date.now() + clockOffset);
  const text = duration(Math.abs(d));
  return d >= 0 ? `in ${text}` : `${text} ago`;
}

function duration(ms) {
  const min = Math.round(ms / 60_000);
  if (ms < 60_000) return `${Math.max(1, Math.round(ms / 1000))} s`;
  if (min < 60) return `${min} min`;
  const h = Math.floor(min / 60);
  if (h < 48) return min % 60 ? `${h} h ${min % 60} min` : `${h} h`;
  return `${Math.round(h / 24)} days`;
}

function expiryText(sb) {
  const t = Date.parse(sb.expires_at || '');
  if (Number.isNaN(t)) return '';
  const d = t - (Date.now() + clockOffset);
  return d >= 0 ? `expires in ${duration(d)}` : `expired ${duration(-d)} ago`;
}

function toast(text, { error = false, link = null } = {}) {
  const t = el('div', error ? 'toast error' : 'toast');
  t.setAttribute('role', error ? 'alert' : 'status');
  const span = el('span', '', text);
  if (link) span.append(link);
  const close = el('button', '', '×');
  close.type = 'button';
  close.setAttribute('aria-label', 'Dismiss');
  const remove = () => t.remove();
  close.addEventListener('click', remove);
  t.append(span, close);
  $('toasts').append(t);
  setTimeout(remove, error ? 10_000 : 6_000);
}

$('signin').addEventListener('submit', onSignIn);
$('signout').addEventListener('click', () => signOut());
document.addEventListener('visibilitychange', () => {
  if (!document.hidden && signedIn) refresh();
});
start();
