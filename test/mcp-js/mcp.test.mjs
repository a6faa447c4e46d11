// The official MCP TypeScript SDK's client against cubicle's MCP server:
// over stdio (the cubicle CLI's `cubicle mcp`, at CUBICLE_BIN) and over
// Streamable HTTP (/mcp on the daemon at CUBICLE_URL), with the key in
// CUBICLE_API_KEY. The stdio tests create one sandbox, the HTTP tests drive
// and destroy it. Run by test/e2e TestMCP.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = process.env.CUBICLE_URL;
const key = process.env.CUBICLE_API_KEY;
const bin = process.env.CUBICLE_BIN;
if (!url || !key || !bin) {
  throw new Error('set CUBICLE_URL, CUBICLE_API_KEY and CUBICLE_BIN');
}

const computerActions = ['key', 'type', 'mouse_move', 'left_click', 'left_click_drag', 'right_click',
  'middle_click', 'double_click', 'triple_click', 'screenshot', 'cursor_position',
  'left_mouse_down', 'left_mouse_up', 'scroll', 'hold_key', 'wait', 'zoom'];
const display = { display_width_px: 1024, display_height_px: 768 };

let sandboxId = '';
const clients = [];

after(async () => {
  for (const c of clients) await c.close().catch(() => {});
  if (sandboxId) {
    // Leave nothing behind if a test failed before destroy_sandbox.
    await fetch(`${url}/v1/sandboxes/${sandboxId}`, { method: 'DELETE', headers: { 'X-API-Key': key } }).catch(() => {});
  }
});

async function connect(transport) {
  const c = new Client({ name: 'cubicle-mcp-js-test', version: '1.0.0' });
  await c.connect(transport);
  clients.push(c);
  return c;
}

function stdio() {
  return connect(new StdioClientTransport({
    command: bin, args: ['mcp'],
    env: { CUBICLE_URL: url, CUBICLE_API_KEY: key, PATH: process.env.PATH ?? '' },
    stderr: 'inherit',
  }));
}

function http(headers = { 'X-API-Key': key }) {
  return connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp`), { requestInit: { headers } }));
}

// pngSize reads a PNG's width and height from its IHDR chunk.
function pngSize(content) {
  assert.equal(content.type, 'image');
  assert.equal(content.mimeType, 'image/png');
  const b = Buffer.from(content.data, 'base64');
  assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'PNG signature');
  return [b.readUInt32BE(16), b.readUInt32BE(20)];
}

function textOf(res) {
  return res.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
}

async function ok(c, name, args) {
  const res = await c.callTool({ name, arguments: args });
  assert.ok(!res.isError, `${name}: ${textOf(res)}`);
  return res;
}

// meet makes two run_command calls at once, the first on a and the second
// on b, that meet in the sandbox: each makes a file of its own, then waits
// for the other's. Both end "met" only if the calls ran at the same time;
// one after the other, the first waits alone until its bound (30 s of
// polling, a guard against a hang, not a timing threshold) and ends
// "alone".
async function meet(a, b, tag) {
  const dir = `/tmp/mcp-js-meet-${tag}`;
  const script = (me, other) => `mkdir -p ${dir} && touch ${dir}/${me} || exit 2
i=0
while [ $i -lt 300 ]; do
  if [ -e ${dir}/${other} ]; then echo met; exit 0; fi
  sleep 0.1; i=$((i+1))
done
echo alone; exit 1`;
  const runs = await Promise.all([
    ok(a, 'run_command', { sandbox_id: sandboxId, command: script('first', 'second'), timeout_seconds: 60 }),
    ok(b, 'run_command', { sandbox_id: sandboxId, command: script('second', 'first'), timeout_seconds: 60 }),
  ]);
  for (const [i, r] of runs.entries()) {
    assert.equal(r.structuredContent.stdout, 'met\n',
      `call ${i + 1} of two at once never saw the other in the sandbox (they ran one after the other): ${textOf(r)}`);
  }
}

test('stdio: tools, create, screenshot, click, type, command, files, bad input, progress', async () => {
  const c = await stdio();
  const { tools } = await c.listTools();
  const names = tools.map((t) => t.name);
  for (const n of ['create_sandbox', 'list_sandboxes', 'destroy_sandbox', 'extend_sandbox', 'view_sandbox',
    'run_command', 'read_file', 'write_file', ...computerActions]) {
    assert.ok(names.includes(n), `tool ${n} missing from ${names}`);
  }
  const click = tools.find((t) => t.name === 'left_click');
  assert.ok(click.inputSchema.required.includes('sandbox_id'));
  assert.ok('coordinate' in click.inputSchema.properties);

  const created = await ok(c, 'create_sandbox', { width: 1920, height: 1080, timeout_seconds: 600 });
  sandboxId = created.structuredContent.sandbox_id;
  assert.match(sandboxId, /^[a-z0-9]+$/);

  const shot = await ok(c, 'screenshot', { sandbox_id: sandboxId, ...display });
  assert.deepEqual(pngSize(shot.content[0]), [1024, 576]);

  const clicked = await ok(c, 'left_click', { sandbox_id: sandboxId, coordinate: [300, 200], ...display });
  assert.deepEqual(pngSize(clicked.content[0]), [1024, 576]);
  const pos = await ok(c, 'cursor_position', { sandbox_id: sandboxId, ...display });
  assert.equal(textOf(pos), 'X=300,Y=200');
  await ok(c, 'type', { sandbox_id: sandboxId, text: 'héllo', ...display });
  await ok(c, 'key', { sandbox_id: sandboxId, text: 'Escape' });

  const run = await ok(c, 'run_command', { sandbox_id: sandboxId, command: 'echo from-$((6*7)); echo oops >&2; exit 4' });
  assert.match(textOf(run), /exit code 4/);
  assert.equal(run.structuredContent.stdout, 'from-42\n');
  assert.equal(run.structuredContent.stderr, 'oops\n');

  await ok(c, 'write_file', { sandbox_id: sandboxId, path: '/tmp/mcp-js.txt', content: 'written by the TypeScript SDK ✓' });
  const read = await ok(c, 'read_file', { sandbox_id: sandboxId, path: '/tmp/mcp-js.txt' });
  assert.equal(textOf(read), 'written by the TypeScript SDK ✓');

  // Bad input: an isError result, nothing run.
  const bad = await c.callTool({ name: 'left_click', arguments: { sandbox_id: sandboxId, coordinate: [5000, 10], ...display } });
  assert.equal(bad.isError, true);
  assert.match(textOf(bad), /outside the screen/);
  const pos2 = await ok(c, 'cursor_position', { sandbox_id: sandboxId, ...display });
  assert.equal(textOf(pos2), 'X=300,Y=200', 'the refused click moved the pointer');

  // A long call reports progress.
  const progress = [];
  await c.callTool({ name: 'wait', arguments: { sandbox_id: sandboxId, duration: 2.5 } }, undefined,
    { onprogress: (p) => progress.push(p) });
  assert.ok(progress.length >= 1, `progress notifications: ${JSON.stringify(progress)}`);
});

test('http: no key is 401', async () => {
  const res = await fetch(`${url}/mcp`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
  });
  assert.equal(res.status, 401);
  const body = await res.json();
  assert.equal(body.error.code, 'unauthorized');
  await assert.rejects(http({}));
});

test('http: tools, screenshot, parallel clients, view, list, destroy', async () => {
  assert.ok(sandboxId, 'the stdio test made no sandbox');
  const c = await http();
  const { tools } = await c.listTools();
  assert.ok(tools.some((t) => t.name === 'zoom'));

  const shot = await ok(c, 'screenshot', { sandbox_id: sandboxId, ...display });
  assert.deepEqual(pngSize(shot.content[0]), [1024, 576]);
  const zoom = await ok(c, 'zoom', { sandbox_id: sandboxId, region: [0, 0, 100, 100], ...display });
  const [zw, zh] = pngSize(zoom.content[0]);
  assert.ok(zw > 100 && zh > 100, `zoom picture ${zw}x${zh}`);

  // Two clients, two connections: their calls run at the same time.
  const d = await http();
  await meet(c, d, 'two-connections');
  // A long call reports progress, on its request's SSE stream.
  const progress = [];
  await c.callTool({ name: 'wait', arguments: { sandbox_id: sandboxId, duration: 2 } }, undefined, { onprogress: (p) => progress.push(p) });
  assert.ok(progress.length >= 1, `progress over HTTP: ${JSON.stringify(progress)}`);

  const view = await ok(c, 'view_sandbox', { sandbox_id: sandboxId });
  assert.ok(view.structuredContent.url.startsWith(url + '/view/' + sandboxId), view.structuredContent.url);
  const list = await ok(c, 'list_sandboxes', {});
  assert.ok(list.structuredContent.sandboxes.some((s) => s.sandbox_id === sandboxId));
  await ok(c, 'extend_sandbox', { sandbox_id: sandboxId, timeout_seconds: 300 });
  await ok(c, 'destroy_sandbox', { sandbox_id: sandboxId });
  const gone = await c.callTool({ name: 'screenshot', arguments: { sandbox_id: sandboxId } });
  assert.equal(gone.isError, true);
  sandboxId = '';
});
