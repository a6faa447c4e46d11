// The unmodified e2b and @e2b/desktop SDKs against a cubicle cluster,
// pointed at one node only (E2B_API_URL and E2B_SANDBOX_URL are node a):
// run by test/e2e TestClusterE2BSDK, not by the single-host suite (the
// file name does not end in .test.mjs). Three creates through a are
// placed on the cluster's nodes; each sandbox is driven through a —
// screenshot, pointer, a command, files — and the native API says which
// node holds it.

import assert from 'node:assert/strict'
import { after, describe, it } from 'node:test'

import { Sandbox as Desktop } from '@e2b/desktop'
import { Sandbox } from 'e2b'

import { env, pngSize } from './lib.mjs'

describe('e2b SDKs through one node of a cluster', { timeout: 5 * 60 * 1000 }, () => {
  const made = []

  after(async () => {
    for (const s of made) await Sandbox.kill(s.sandboxId).catch(() => {})
  })

  it('three creates through node a, each driven through a', async () => {
    for (let i = 0; i < 3; i++) made.push(await Desktop.create('base', { timeoutMs: 5 * 60 * 1000 }))
    const nodes = []
    for (const [i, d] of made.entries()) {
      const png = await d.screenshot()
      assert.deepEqual(pngSize(png), { width: 1024, height: 768 }, `sandbox ${i}: screenshot`)
      await d.moveMouse(300 + i, 400 + i)
      assert.deepEqual(await d.getCursorPosition(), { x: 300 + i, y: 400 + i }, `sandbox ${i}: pointer`)
      await d.files.write('/tmp/through-a.txt', `sandbox ${d.sandboxId}`)
      const r = await d.commands.run('cat /tmp/through-a.txt')
      assert.equal(r.stdout, `sandbox ${d.sandboxId}`)
      assert.equal(await d.files.read('/tmp/through-a.txt'), `sandbox ${d.sandboxId}`)
      const info = await (await fetch(`${env('E2B_API_URL')}/v1/sandboxes/${d.sandboxId}`, {
        headers: { 'X-API-Key': env('E2B_API_KEY') },
      })).json()
      nodes.push(info.node)
    }
    console.log(`CLUSTER_NODES ${nodes.join(' ')}`)
    assert.ok(new Set(nodes).size >= 2, `three creates all went to ${nodes}`)
  })
})
