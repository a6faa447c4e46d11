// Signed file URLs of the unmodified e2b SDK: uploadUrl and downloadUrl
// make links that carry a signature instead of the envd access token, for
// a browser or another program to use. They work through cubicled's data
// plane, allow only the path and operation they were made for, and stop
// working when they expire.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import https from 'node:https'
import { after, before, describe, it } from 'node:test'

import { Sandbox } from 'e2b'

import { env, fetchVia, sleep } from './lib.mjs'

const run = randomBytes(6).toString('hex')

// postVia POSTs body to url through addr, as fetchVia GETs: no header but
// the ones given, so no access token.
function postVia(addr, url, headers, body) {
  const u = new URL(url)
  const i = addr.lastIndexOf(':')
  return new Promise((resolve, reject) => {
    const req = https.request({
      method: 'POST',
      host: addr.slice(0, i),
      port: Number(addr.slice(i + 1)),
      servername: u.hostname,
      path: u.pathname + u.search,
      headers: { Host: u.host, 'Content-Length': body.length, ...headers },
      timeout: 30000,
    }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`POST ${url} via ${addr}: timed out`)))
    req.on('error', reject)
    req.end(body)
  })
}

// upload sends text as the multipart form a browser's file input makes.
function upload(addr, url, text) {
  const boundary = `----cubicle${randomBytes(8).toString('hex')}`
  const body = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="upload.txt"\r\nContent-Type: text/plain\r\n\r\n`),
    Buffer.from(text),
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ])
  return postVia(addr, url, { 'Content-Type': `multipart/form-data; boundary=${boundary}` }, body)
}

describe('e2b SDK, signed file URLs', { timeout: 5 * 60 * 1000 }, () => {
  let sbx
  const tls = env('CUBICLE_TLS_ADDR')
  // The SDK makes a link on the sandbox's own host (https://49983-ID.DOMAIN)
  // unless E2B_SANDBOX_URL is set, which this suite sets for its other
  // calls; then the link would point at that URL, which names no sandbox.
  // Put the link on the host a user without E2B_SANDBOX_URL gets.
  const own = (link) => {
    const u = new URL(link)
    return `https://${sbx.getHost(49983)}${u.pathname}${u.search}`
  }
  const path = '/home/user/signed.txt'
  const text = 'uploaded through a signed URL ✓'

  before(async () => {
    sbx = await Sandbox.create('base', { metadata: { suite: 'cubicle-e2b-js', run } })
  })

  after(async () => {
    if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  })

  it('uploadUrl and downloadUrl work with no access token', async () => {
    const up = own(await sbx.uploadUrl(path, { useSignatureExpiration: 120 }))
    assert.match(up, /[?&]signature=v1_/)
    assert.match(up, /[?&]signature_expiration=\d+/)
    const r = await upload(tls, up, text)
    assert.equal(r.status, 200, `upload through ${up}: ${r.status} ${r.body}`)
    assert.equal(await sbx.files.read(path), text)

    const down = own(await sbx.downloadUrl(path))
    const d = await fetchVia(tls, down)
    assert.equal(d.status, 200, `download through ${down}: ${d.status} ${d.body}`)
    assert.equal(d.body, text)
  })

  it('a signed URL allows only its own path and operation', async () => {
    const down = own(await sbx.downloadUrl(path))
    const other = down.replace(encodeURIComponent(path), encodeURIComponent('/etc/shadow'))
    assert.notEqual(other, down)
    const r = await fetchVia(tls, other)
    assert.equal(r.status, 401, `a download URL changed to another path: ${r.status} ${r.body}`)
    // The download link cannot upload.
    const w = await upload(tls, down, 'overwritten')
    assert.equal(w.status, 401, `a download URL used to upload: ${w.status} ${w.body}`)
    assert.equal(await sbx.files.read(path), text)
  })

  it('refuses after expiry, and changes nothing', async () => {
    const down = own(await sbx.downloadUrl(path, { useSignatureExpiration: 1 }))
    const up = own(await sbx.uploadUrl(path, { useSignatureExpiration: 1 }))
    // signature_expiration is a Unix second; the daemon refuses once its
    // clock (this machine's) is past that second: wait for that moment, and
    // a little more, rather than a fixed 2.5 s.
    const exp = Math.max(...[down, up].map((u) => Number(new URL(u).searchParams.get('signature_expiration'))))
    assert.ok(exp > 0, `no signature_expiration in ${down} and ${up}`)
    await sleep((exp + 1) * 1000 + 250 - Date.now())
    const d = await fetchVia(tls, down)
    assert.equal(d.status, 401, `an expired download URL: ${d.status} ${d.body}`)
    assert.match(d.body, /expired/)
    const u = await upload(tls, up, 'too late')
    assert.equal(u.status, 401, `an expired upload URL: ${u.status} ${u.body}`)
    assert.equal(await sbx.files.read(path), text)
  })
})
