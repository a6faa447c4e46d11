// The live view of one sandbox, opened from a view link /view/{id}?token=T.
// It asks the daemon whether the link is still good, connects noVNC to the
// sandbox's VNC WebSocket, and after a drop checks the link again before it
// reconnects, so a link that expired, was revoked or whose sandbox ended
// stops with a message instead of retrying forever.
//
// For automated tests the page exposes document.body.dataset.state
// (connecting | connected | reconnecting | ended) and, once ended,
// document.body.dataset.reason; noVNC's canvas is the only canvas in #screen.

const $ = (id) => document.getElementById(id);

const sandboxID = decodeURIComponent(location.pathname.split('/').filter(Boolean).pop() || '');
const token = new URLSearchParams(location.search).get('token') || '';

// Loaded by a dynamic import, in parallel with the first status check, so
// that a daemon without noVNC shows a message instead of a blank page (a
// failed static import would stop this module before it ran a line).
const rfbModule = import('/static/novnc/core/rfb.js');
rfbModule.catch(() => {}); // reported where it is awaited

const maxDelayMs = 10_000;
// A connection that lived this long was a success: the next drop starts
// the backoff again from one second.
const stableMs = 10_000;
const endedStates = new Set(['stopping', 'stopped', 'failed']);

let rfb = null;
let ended = false;
let failures = 0;
let connectedAt = 0;
let viewOnly = true;
let tokenExpiry = NaN; // ms since the epoch, server clock
let clockOffset = 0; // server clock minus ours, from the Date header
let wakeRetry = null; // ends the current backoff wait early (used by end)
let expiryTimer = 0;

const serverNow = () => Date.now() + clockOffset;

function setState(state, text) {
  document.body.dataset.state = state;
  // Only changes reach the live region; the per-second countdown of a
  // retry lives outside it, or a screen reader would read every tick.
  if ($('status').textContent !== text) $('status').textContent = text;
  $('retry').textContent = '';
}

// end stops for good: shows why over the screen and never reconnects.
function end(title, detail = '') {
  if (ended) return;
  ended = true;
  clearInterval(expiryTimer);
  if (wakeRetry) wakeRetry();
  document.body.dataset.reason = detail ? `${title}: ${detail}` : title;
  setState('ended', `Ended — ${title}`);
  $('overlay-title').textContent = title;
  $('overlay-detail').textContent = detail;
  $('overlay').hidden = false;
  $('clipboard-panel').hidden = true;
  $('clipboard-toggle').hidden = true;
  $('expiry').textContent = '';
  if (rfb) {
    const r = rfb;
    rfb = null;
    r.disconnect();
  }
}

const expiredTitle = 'This view link has expired — ask for a new one';
const sandboxEndedTitle = 'The sandbox has ended';

// finalTitle turns an API refusal of the link into what the viewer should
// read. The codes cannot tell an expired token from a mistyped one, so the
// message and the expiry the page already knows decide.
function finalTitle(status, message) {
  const m = message.toLowerCase();
  if (status === 404 || /\b(ended|stopped|destroyed|deleted|gone)\b/.test(m)) {
    return sandboxEndedTitle;
  }
  if (status === 401) {
    if (/expired/.test(m) || serverNow() >= tokenExpiry) return expiredTitle;
    return 'This view link is not valid — ask for a new one';
  }
  if (/revoked/.test(m)) return 'This view link has been revoked — ask for a new one';
  return 'This view link is not for this sandbox — ask for a new one';
}

// checkStatus asks the daemon about the link. It returns '' when the page
// may connect, or a short reason to wait and ask again; for a link that will
// never work again it calls end.
async function checkStatus() {
  let res;
  try {
    res = await fetch(location.pathname + location.search, {
      headers: { Accept: 'application/json' },
      cache: 'no-store',
    });
  } catch {
    return 'the daemon cannot be reached';
  }
  const date = Date.parse(res.headers.get('Date') || '');
  if (!Number.isNaN(date)) clockOffset = date - Date.now();
  let body = null;
  try {
    body = await res.json();
  } catch {
    // handled below
  }
  if (res.ok) {
    if (!body || typeof body !== 'object') {
      // The link was accepted but the status is unreadable: connect in
      // view-only mode (the daemon enforces the link's mode regardless).
      console.warn('live view: status answer is not JSON');
      applyStatus({});
      return '';
    }
    applyStatus(body);
    if (ended) return '';
    const state = body.state || 'running';
    if (endedStates.has(state)) {
      end(sandboxEndedTitle, `It is ${state}.`);
      return '';
    }
    return state === 'running' ? '' : `the sandbox is ${state}`;
  }
  const message = (body && body.error && body.error.message) || `HTTP ${res.status}`;
  if (res.status === 401 || res.status === 403 || res.status === 404) {
    end(finalTitle(res.status, message), message);
    return '';
  }
  return message;
}

// applyStatus takes the link's mode and expiries from a status answer.
function applyStatus(s) {
  viewOnly = s.view_only !== false;
  const mode = $('mode');
  mode.hidden = false;
  mode.textContent = viewOnly ? 'view only' : 'control';
  mode.className = `badge ${viewOnly ? 'view-only' : 'control'}`;
  mode.title = viewOnly
    ? 'You can watch this desktop; input is not sent'
    : 'Your mouse and keyboard control this desktop';
  $('clipboard-toggle').hidden = viewOnly;
  if (viewOnly) $('clipboard-panel').hidden = true;
  if (rfb) rfb.viewOnly = viewOnly;

  const t = Date.parse(s.expires_at || '');
  if (!Number.isNaN(t)) tokenExpiry = t;
  const parts = [];
  if (!Number.isNaN(tokenExpiry)) parts.push(`View link expires ${new Date(tokenExpiry - clockOffset).toLocaleString()}`);
  const sb = Date.parse(s.sandbox_expires_at || '');
  if (!Number.isNaN(sb)) parts.push(`sandbox expires ${new Date(sb - clockOffset).toLocaleString()}`);
  $('expiry').title = parts.join('; ');
  if (!expiryTimer) expiryTimer = setInterval(tickExpiry, 1000);
  tickExpiry();
}

function tickExpiry() {
  if (ended || Number.isNaN(tokenExpiry)) return;
  const left = tokenExpiry - serverNow();
  if (left <= 0) {
    end(expiredTitle);
    return;
  }
  $('expiry').textContent = `Link expires in ${formatDuration(left)}`;
}

function formatDuration(ms) {
  const s = Math.ceil(ms / 1000);
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, '0');
  if (d > 0) return `${d} d ${h} h`;
  if (h > 0) return `${h}:${String(m).padStart(2, '0')}:${sec}`;
  return `${m}:${sec}`;
}

const capitalize = (s) => s.charAt(0).toUpperCase() + s.slice(1);

// wait shows a countdown to the next attempt. end cuts it short.
function wait(ms, why) {
  return new Promise((resolve) => {
    const until = Date.now() + ms;
    setState('reconnecting', `${capitalize(why)} — reconnecting`);
    const show = () => {
      const n = Math.max(1, Math.ceil((until - Date.now()) / 1000));
      $('retry').textContent = ` in ${n} s`;
    };
    show();
    let timer = 0;
    const tick = setInterval(show, 1000);
    const done = () => {
      clearInterval(tick);
      clearTimeout(timer);
      $('retry').textContent = '';
      wakeRetry = null;
      resolve();
    };
    timer = setTimeout(done, ms);
    wakeRetry = done;
  });
}

function nextDelay() {
  const ms = Math.min(1000 * 2 ** failures, maxDelayMs);
  failures++;
  return ms;
}

// run checks the link and connects; after a drop (first false) it waits out
// the backoff before connecting, and while the daemon cannot answer or the
// sandbox is not running yet it keeps checking with the same backoff.
async function run(first) {
  let lost = !first;
  for (;;) {
    const why = await checkStatus();
    if (ended) return;
    if (why === '' && !lost) break;
    await wait(nextDelay(), why || 'connection lost');
    if (ended) return;
    lost = false;
    if (why === '') break;
  }
  connect();
}

async function connect() {
  let RFB;
  try {
    RFB = (await rfbModule).default;
  } catch (err) {
    console.error('live view: loading noVNC:', err);
    end('The live view cannot start', 'Its VNC client (noVNC) is not installed on this daemon.');
    return;
  }
  if (ended) return;
  if (document.body.dataset.state === 'reconnecting') {
    setState('reconnecting', 'Reconnecting…');
  } else {
    setState('connecting', 'Connecting…');
  }
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const url = `${scheme}//${location.host}/v1/sandboxes/${encodeURIComponent(sandboxID)}` +
    `/vnc?token=${encodeURIComponent(token)}`;
  let r;
  try {
    r = new RFB($('screen'), url, { shared: true, wsProtocols: ['binary'] });
  } catch (err) {
    console.error('live view: connecting:', err);
    run(false);
    return;
  }
  rfb = r;
  r.scaleViewport = true;
  r.resizeSession = false;
  r.viewOnly = viewOnly;
  r.background = '#0b0c0e';

  let refusal = '';
  r.addEventListener('connect', () => {
    if (r !== rfb) return;
    connectedAt = Date.now();
    setState('connected', 'Connected');
    if (!viewOnly) r.focus({ preventScroll: true });
  });
  r.addEventListener('disconnect', () => {
    if (r !== rfb) return;
    rfb = null;
    if (ended) return;
    if (refusal) {
      end('The sandbox refused the connection', refusal);
      return;
    }
    if (connectedAt && Date.now() - connectedAt >= stableMs) failures = 0;
    connectedAt = 0;
    run(false);
  });
  // The daemon's VNC endpoint needs no VNC password (the link's token is
  // the credential), so either of these is a configuration problem that
  // retrying would not fix.
  r.addEventListener('credentialsrequired', () => {
    refusal = 'The VNC server asked for a password, which the live view does not use.';
    r.disconnect();
  });
  r.addEventListener('securityfailure', (e) => {
    refusal = e.detail.reason || `VNC security negotiation failed (status ${e.detail.status}).`;
  });
  r.addEventListener('clipboard', (e) => {
    if (viewOnly) return;
    $('clipboard-text').value = e.detail.text;
    note('Copied in the sandbox');
  });
  r.addEventListener('desktopname', (e) => {
    if (e.detail.name) document.title = `${e.detail.name} · cubicle`;
  });
}

let noteTimer = 0;
function note(text) {
  $('clipboard-note').textContent = text;
  clearTimeout(noteTimer);
  noteTimer = setTimeout(() => { $('clipboard-note').textContent = ''; }, 3000);
}

function setupControls() {
  const panel = $('clipboard-panel');
  const toggle = $('clipboard-toggle');
  const showPanel = (show) => {
    panel.hidden = !show;
    toggle.setAttribute('aria-expanded', String(show));
    if (show) {
      $('clipboard-text').focus();
    } else if (rfb && !viewOnly) {
      rfb.focus({ preventScroll: true });
    }
  };
  toggle.addEventListener('click', () => showPanel(panel.hidden));
  $('clipboard-close').addEventListener('click', () => showPanel(false));
  panel.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') showPanel(false);
  });
  $('clipboard-send').addEventListener('click', () => {
    if (!rfb || viewOnly || document.body.dataset.state !== 'connected') {
      note('Not connected');
      return;
    }
    rfb.clipboardPasteFrom($('clipboard-text').value);
    note('Sent — paste it in the sandbox');
  });

  const fs = $('fullscreen');
  if (!document.fullscreenEnabled) {
    fs.hidden = true;
  }
  fs.addEventListener('click', () => {
    if (document.fullscreenElement) {
      document.exitFullscreen().catch(() => {});
    } else {
      document.documentElement.requestFullscreen().catch(() => {});
    }
  });
  document.addEventListener('fullscreenchange', () => {
    const on = Boolean(document.fullscreenElement);
    fs.textContent = on ? 'Exit fullscreen' : 'Fullscreen';
    fs.setAttribute('aria-pressed', String(on));
  });

  // Close the WebSocket when the tab goes away rather than leaving the
  // daemon to notice; a page restored from the back/forward cache starts
  // over, since its connection and status are stale.
  window.addEventListener('pagehide', () => {
    if (ended) return;
    ended = true;
    if (rfb) rfb.disconnect();
  });
  window.addEventListener('pageshow', (e) => {
    if (e.persisted) location.reload();
  });
}

$('sandbox-id').textContent = sandboxID;
setupControls();
if (!token) {
  end('This view link has no token — ask for a new one');
} else {
  setState('connecting', 'Connecting…');
  run(true);
}

// Recordings: the sandbox's screen recordings, replayed in a <video>. They
// belong to an API key, which a view link does not carry, so the panel
// appears only with the key the dashboard keeps for this tab (or on a
// daemon without keys). The file is fetched with the key and played from a
// blob URL: a <video src> could not send the key.
const recKey = sessionStorage.getItem('cubicle.apiKey') || '';
const recHeaders = recKey ? { 'X-API-Key': recKey } : {};
let recBlobURL = '';

async function listRecordings() {
  const res = await fetch(`/v1/sandboxes/${encodeURIComponent(sandboxID)}/recordings`, { headers: recHeaders });
  if (!res.ok) return null;
  return (await res.json()).recordings || [];
}

async function showRecordings() {
  const list = $('recordings-list');
  const recs = await listRecordings();
  list.replaceChildren();
  if (!recs || recs.length === 0) {
    $('recordings-note').textContent = recs ? 'No recordings yet.' : 'Could not list recordings.';
    return;
  }
  $('recordings-note').textContent = '';
  for (const r of recs) {
    const li = document.createElement('li');
    const secs = (r.duration_ms / 1000).toFixed(1);
    li.textContent = `${new Date(r.started_at).toLocaleTimeString()} · ${secs} s · ${r.state} `;
    if (r.state !== 'recording' && r.size_bytes > 0) {
      const play = document.createElement('button');
      play.type = 'button';
      play.textContent = 'Play';
      play.addEventListener('click', () => playRecording(r));
      li.append(play);
    }
    list.append(li);
  }
}

async function playRecording(r) {
  $('recordings-note').textContent = 'Loading…';
  const res = await fetch(`/v1/recordings/${encodeURIComponent(r.id)}/file`, { headers: recHeaders });
  if (!res.ok) {
    $('recordings-note').textContent = `Could not load the recording (${res.status}).`;
    return;
  }
  if (recBlobURL) URL.revokeObjectURL(recBlobURL);
  recBlobURL = URL.createObjectURL(await res.blob());
  const video = $('recording-video');
  video.src = recBlobURL;
  video.hidden = false;
  $('recordings-note').textContent = '';
  video.play().catch(() => {});
}

function toggleRecordings(open) {
  $('recordings-panel').hidden = !open;
  $('recordings-toggle').setAttribute('aria-expanded', String(open));
  if (open) showRecordings();
  else $('recording-video').pause();
}

if (sandboxID) {
  listRecordings().then((recs) => {
    if (recs === null) return; // no key for them here
    $('recordings-toggle').hidden = false;
    $('recordings-toggle').addEventListener('click', () => toggleRecordings($('recordings-panel').hidden));
    $('recordings-close').addEventListener('click', () => toggleRecordings(false));
  }).catch(() => {});
}
