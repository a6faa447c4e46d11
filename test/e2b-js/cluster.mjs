// The unmodified e2b and @e2b/desktop SDKs against a cubicle cluster,
// pointed at one node only (E2B_API_URL and E2B_SANDBOX_URL are node a;
// CUBICLE_TLS_ADDR is a's TLS listener for https://*.E2B_DOMAIN): run by
// test/e2e TestClusterE2BSDK, not by the single-host suite (the file name
// does not end in .test.mjs). Nine creates through a (or as many as
// CUBICLE_E2E_CLUSTER_SANDBOXES says, at least three) are placed on all
// three nodes; each sandbox is driven through a — screenshot, a click,
// a command, files, the live view — the native API says which node holds
// it, and E2B's Sandbox.list through a lists them all, over more than
// one page.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, describe, it } from 'node:test'

import { Sandbox as Desktop } from '@e2b/desktop'
import { Sandbox } from 'e2b'

import { env, fetchVia, pngSize, websocketVia } from './lib.mjs'

const run = randomBytes(6).toString('hex')
const count = Number(process.env.CUBICLE_E2E_CLUSTER_SANDBOXES || 9)
// Four to a page for nine, two for fewer: always more than one page.
const pageLimit = Math.max(2, Math.floor((count - 1) / 2))

describe('e2b SDKs through one node of a cluster', { timeout: 12 * 60 * 1000 }, () => {
  const made = []

  after(async () => {
    for (const s of made) await Sandbox.kill(s.sandboxId).catch(() => {})
  })

  it(`${count} creates through node a, each driven through a`, async () => {
    assert.ok(Number.isInteger(count) && count >= 3, `CUBICLE_E2E_CLUSTER_SANDBOXES=${count}: want at least 3, one for each node`)
    // Three at a time, as agents starting together would.
    for (let i = 0; i < count; i += 3) {
      made.push(...await Promise.all(Array.from({ length: Math.min(3, count - i) }, () =>
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
    assert.deepEqual([...new Set(nodes)].sort(), ['a', 'b', 'c'], `${count} creates went to ${nodes}`)

    // E2B's list through a spans the nodes, a page at a time.
    const listed = []
    let nonEmpty = 0
    const pages = Sandbox.list({ limit: pageLimit, query: { metadata: { run } } })
    while (pages.hasNext) {
      const page = await pages.nextItems()
      assert.ok(page.length <= pageLimit, `a page of ${page.length}, over the limit of ${pageLimit}`)
      if (page.length > 0) nonEmpty++
      listed.push(...page)
    }
    assert.ok(nonEmpty >= 2, `Sandbox.list of ${count} with limit ${pageLimit} came in ${nonEmpty} page(s)`)
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), made.map((d) => d.sandboxId).sort(),
      `Sandbox.list through a, ${pageLimit} to a page`)
  })
})
