// Sandbox logs through E2B's control plane. The e2b 2.51 SDK has no
// getLogs; the endpoints are in its API spec, so the test calls them as
// the SDK calls every other one: its own ApiClient (openapi-fetch, the
// X-API-KEY header, E2B_API_URL). A line a program in the sandbox prints
// on the console (the agent's stdout, /proc/1/fd/1, which a root process
// may write) must come back from GET /v2/sandboxes/{id}/logs and the
// deprecated GET /sandboxes/{id}/logs, with E2B's fields and filters, and
// stay readable for a while after the sandbox is killed.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, before, describe, it } from 'node:test'

import { ApiClient, ConnectionConfig, Sandbox } from 'e2b'

import { waitFor } from './lib.mjs'

const run = randomBytes(6).toString('hex')

describe('e2b sandbox logs', { timeout: 5 * 60 * 1000 }, () => {
  let sbx, api
  const marker = `cubicle-e2b-log-${run}`

  // logsV2 calls GET /v2/sandboxes/{id}/logs with query and returns
  // openapi-fetch's {data, error, response}.
  const logsV2 = (query) => api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query } })

  before(async () => {
    sbx = await Sandbox.create('base', { metadata: { suite: 'cubicle-e2b-js-logs', run } })
    api = new ApiClient(new ConnectionConfig()).api
  })

  after(async () => {
    if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  })

  it('returns a line the sandbox printed, with E2B\'s fields', async () => {
    const r = await sbx.commands.run(`echo ${marker} > /proc/1/fd/1`, { user: 'root' })
    assert.equal(r.exitCode, 0, r.stderr)
    const found = await waitFor('the marker in the v2 logs', async () => {
      const { data, error } = await logsV2({ search: marker })
      assert.equal(error, undefined, JSON.stringify(error))
      return data.logs.length > 0 && data.logs
    }, 20000)
    assert.equal(found.length, 1, JSON.stringify(found))
    const [e] = found
    assert.equal(e.message, marker)
    assert.equal(e.level, 'info')
    assert.deepEqual(e.fields, {})
    const at = Date.parse(e.timestamp)
    assert.ok(Math.abs(at - Date.now()) < 60_000, `timestamp ${e.timestamp} is not about now`)

    // The cursor (ms) bounds it: forward from after it, the line is gone;
    // backward from it, it is the newest.
    const { data: afterIt } = await logsV2({ search: marker, cursor: at + 1 })
    assert.deepEqual(afterIt.logs, [])
    const { data: back } = await logsV2({ cursor: at, direction: 'backward', limit: 1 })
    assert.equal(back.logs.length, 1)
    assert.ok(Date.parse(back.logs[0].timestamp) <= at + 1)

    // The agent's own lines are structured: level and fields.
    const { data: agent } = await logsV2({ search: 'process started', limit: 1000 })
    assert.ok(agent.logs.some((l) => l.level === 'info' && l.fields.user === 'root'), JSON.stringify(agent.logs.slice(0, 5)))
    const { data: errorsOnly } = await logsV2({ level: 'error', search: marker })
    assert.deepEqual(errorsOnly.logs, [])

    // The deprecated endpoint: the line twice, plain and structured.
    const { data: v1, error: v1err } = await api.GET('/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId } } })
    assert.equal(v1err, undefined, JSON.stringify(v1err))
    assert.ok(v1.logs.some((l) => l.line === marker), 'v1 logs lack the marker')
    assert.ok(v1.logEntries.some((l) => l.message === marker), 'v1 logEntries lack the marker')
  })

  it('answers bad parameters 400 in E2B\'s error shape', async () => {
    for (const query of [{ direction: 'sideways' }, { level: 'fatal' }, { limit: 1001 }, { cursor: -1 }]) {
      const { error, response } = await logsV2(query)
      assert.equal(response.status, 400, JSON.stringify(query))
      assert.equal(error.code, 400)
      assert.equal(typeof error.message, 'string')
    }
    const { error, response } = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: 'nosuchsandbox' } } })
    assert.equal(response.status, 404)
    assert.equal(error.code, 404)
  })

  it('keeps the logs a while after kill', async () => {
    assert.equal(await Sandbox.kill(sbx.sandboxId), true)
    const { data, error } = await logsV2({ search: marker })
    assert.equal(error, undefined, JSON.stringify(error))
    assert.deepEqual(data.logs.map((l) => l.message), [marker])
  })
})
