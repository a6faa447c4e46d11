// The unmodified e2b and @e2b/desktop SDKs against a cubicle cluster,
// pointed at one node only (E2B_API_URL and E2B_SANDBOX_URL are node a;
// CUBICLE_TLS_ADDR is a's TLS listener for https://*.E2B_DOMAIN): run by
// test/e2e TestClusterE2BSDK, not by the single-host suite (the file name
// does not end in .test.mjs). Nine creates through a are placed on all
// three nodes; each sandbox is driven through a — screenshot, a click,
// a command, files, the live view — the native API says which node holds
// it, and E2B's Sandbox.list through a lists all nine.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, describe, it } from 'node:test'

import { Sandbox as Desktop } from '@e2b/desktop'
import { Sandbox } from 'e2b'

import { env, fetchVia, pngSize, websocketVia } from './lib.mjs'

const run = randomBytes(6).toString('hex')

describe('e2b SDKs through one node of a cluster', { timeout: 12 * 60 * 1000 }, () => {
  const made = []

  after(async () => {
    for (const s of made) await Sandbox.kill(s.sandboxId).catch(() => {})
  })

  it('nine creates through node a, each driven through a', async () => {
    // Three at a time, as agents starting together would.
    for (let i = 0; i < 9; i += 3) {
      made.push(...await Promise.all([0, 1, 2].map(() =>
        Desktop.create('base', { metadata: { run }, timeoutMs: 10 * 60 * 1000 }))))
    }
    // Driven three at a time: each waits mostly on its own desktop.
    const drive = async (d, i) => {
      const png = await d.screenshot()
      assert.deepEqual(pngSize(png), { width: 1024, height: 768 }, `sandbox ${i}: screenshot`)
      const x = 300 + i, y = 400 + i
      await d.leftClick(x, y)
      assert.deepEqual(await d.getCursorPosition(), { x, y }, `sandbox ${i}: the click's position`)
      await d.files.write('/tmp/through-a.txt', `sandbox ${d.sandboxId}`)
      const r = await d.commands.run('cat /tmp/through-a.txt; echo; xdotool getmouselocation --shell | head -2 | tr "\\n" " "')
      assert.equal(r.stdout, `sandbox ${d.sandboxId}\nX=${x} Y=${y} `, `sandbox ${i}: the command's output`)
      assert.equal(await d.files.read('/tmp/through-a.txt'), `sandbox ${d.sandboxId}`)

      // The live view: noVNC's page and its WebSocket, over a's TLS
      // listener, reach the sandbox's node by the host name alone.
      await d.stream.start()
      try {
        const url = d.stream.getUrl()
        assert.equal(new URL(url).host, `6080-${d.sandboxId}.${env('E2B_DOMAIN')}`)
        const res = await fetchVia(env('CUBICLE_TLS_ADDR'), url)
        assert.equal(res.status, 200, `sandbox ${i}: GET ${url}: ${res.status} ${res.body.slice(0, 200)}`)
        assert.match(res.body, /noVNC/)
        const ws = await websocketVia(env('CUBICLE_TLS_ADDR'), `https://${new URL(url).host}/websockify`)
        try {
          assert.equal(ws.status, 101, `sandbox ${i}: the stream's WebSocket`)
          assert.match((await ws.next()).toString('latin1'), /^RFB 003\.00\d\n/)
        } finally {
          ws.close()
        }
      } finally {
        await d.stream.stop()
      }

      const info = await (await fetch(`${env('E2B_API_URL')}/v1/sandboxes/${d.sandboxId}`, {
        headers: { 'X-API-Key': env('E2B_API_KEY') },
      })).json()
      return info.node
    }
    const nodes = []
    for (let i = 0; i < made.length; i += 3) {
      nodes.push(...await Promise.all(made.slice(i, i + 3).map((d, j) => drive(d, i + j))))
    }
    console.log(`CLUSTER_NODES ${nodes.join(' ')}`)
    assert.deepEqual([...new Set(nodes)].sort(), ['a', 'b', 'c'], `nine creates went to ${nodes}`)

    // E2B's list through a spans the nodes, four to a page.
    const listed = []
    const pages = Sandbox.list({ limit: 4, query: { metadata: { run } } })
    while (pages.hasNext) listed.push(...await pages.nextItems())
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), made.map((d) => d.sandboxId).sort(),
      'Sandbox.list through a, a page at a time')
  })
})
