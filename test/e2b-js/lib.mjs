// Helpers shared by the E2B SDK tests: the environment test/e2e/e2b_test.go
// sets, skips for gaps of the desktop image (never of the daemon), polling,
// a small PNG decoder and an HTTPS fetch that reaches the daemon's TLS port
// under a sandbox host name. No dependencies besides node's own modules.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import https from 'node:https'
import zlib from 'node:zlib'

// env returns a required environment variable or throws naming it.
export function env(name) {
  const v = process.env[name]
  if (!v) throw new Error(`${name} is not set (run these tests through test/e2e TestE2BSDK)`)
  return v
}

// imageGap is the `skip` option of a test that needs something the desktop
// image does not have yet: the reason, or false when nothing is missing or
// CUBICLE_REQUIRE_E2E=1 forbids skipping (then the test runs and fails, as
// the Go tests' needs.Skip does).
export function imageGap(missing) {
  if (missing.length === 0 || process.env.CUBICLE_REQUIRE_E2E === '1') return false
  return `desktop image gap, not a daemon bug: ${missing.join('; ')}`
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// waitFor polls fn until it returns a truthy value and returns that value;
// after timeoutMs it fails with what and the last value seen.
export async function waitFor(what, fn, timeoutMs = 30000, intervalMs = 250) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    last = await fn()
    if (last) return last
    if (Date.now() > deadline) assert.fail(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${JSON.stringify(last)})`)
    await sleep(intervalMs)
  }
}

// probe runs a shell command and returns its exit code and output without
// throwing on a non-zero exit, for probes.
export async function probe(sbx, cmd) {
  try {
    const r = await sbx.commands.run(cmd)
    return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr }
  } catch (e) {
    if (e.exitCode === undefined) throw e
    return { exitCode: e.exitCode, stdout: e.stdout, stderr: e.stderr }
  }
}

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

// pngSize reads width and height from a PNG's IHDR chunk.
export function pngSize(bytes) {
  const b = Buffer.from(bytes)
  assert.ok(b.subarray(0, 8).equals(PNG_SIGNATURE), 'not a PNG (bad signature)')
  assert.equal(b.toString('latin1', 12, 16), 'IHDR', 'first PNG chunk is not IHDR')
  return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) }
}

// decodePNG decodes an 8-bit, non-interlaced grey, RGB or RGBA PNG (what
// scrot writes) into rows of pixels: pixel(x, y) returns [r, g, b].
export function decodePNG(bytes) {
  const b = Buffer.from(bytes)
  const { width, height } = pngSize(b)
  const depth = b[24], colour = b[25], interlace = b[28]
  const channels = { 0: 1, 2: 3, 4: 2, 6: 4 }[colour]
  assert.ok(depth === 8 && channels && interlace === 0, `unsupported PNG: depth ${depth}, colour type ${colour}, interlace ${interlace}`)
  const idat = []
  for (let off = 8; off < b.length;) {
    const len = b.readUInt32BE(off), type = b.toString('latin1', off + 4, off + 8)
    if (type === 'IDAT') idat.push(b.subarray(off + 8, off + 8 + len))
    if (type === 'IEND') break
    off += 12 + len
  }
  const raw = zlib.inflateSync(Buffer.concat(idat))
  const stride = width * channels
  const px = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const out = px.subarray(y * stride, (y + 1) * stride)
    const up = y > 0 ? px.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride)
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? out[i - channels] : 0
      const c = i >= channels ? up[i - channels] : 0
      let v = line[i]
      switch (filter) {
        case 0: break
        case 1: v += a; break
        case 2: v += up[i]; break
        case 3: v += (a + up[i]) >> 1; break
        case 4: { // Paeth
          const p = a + up[i] - c, pa = Math.abs(p - a), pb = Math.abs(p - up[i]), pc = Math.abs(p - c)
          v += pa <= pb && pa <= pc ? a : pb <= pc ? up[i] : c
          break
        }
        default: assert.fail(`bad PNG filter ${filter} on row ${y}`)
      }
      out[i] = v & 0xff
    }
  }
  return {
    width,
    height,
    pixel(x, y) {
      const o = y * stride + x * channels
      return channels < 3 ? [px[o], px[o], px[o]] : [px[o], px[o + 1], px[o + 2]]
    },
  }
}

// near reports whether two [r, g, b] colours are within a small distance.
export function near(a, b, tolerance = 12) {
  return a.every((v, i) => Math.abs(v - b[i]) < tolerance)
}

// fetchVia GETs url by connecting to addr ("host:port", the daemon's TLS
// listener) with the URL's host as TLS server name and Host header, as a
// browser resolving *.<domain> to the daemon would. The certificate is
// checked against the test CA (NODE_EXTRA_CA_CERTS).
export function fetchVia(addr, url, headers = {}) {
  const u = new URL(url)
  const i = addr.lastIndexOf(':')
  return new Promise((resolve, reject) => {
    const req = https.request({
      host: addr.slice(0, i),
      port: Number(addr.slice(i + 1)),
      servername: u.hostname,
      path: u.pathname + u.search,
      headers: { Host: u.host, ...headers },
      timeout: 30000,
    }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`GET ${url} via ${addr}: timed out`)))
    req.on('error', reject)
    req.end()
  })
}

// websocketVia opens a WebSocket (HTTP/1.1 upgrade) to url through addr
// like fetchVia. It resolves with {status, protocol, next, send, close}:
// next() resolves with the payload of the next message from the server,
// send(data) sends a masked binary message, close() drops the connection.
export function websocketVia(addr, url, protocols = ['binary']) {
  const u = new URL(url)
  const i = addr.lastIndexOf(':')
  return new Promise((resolve, reject) => {
    const req = https.request({
      host: addr.slice(0, i),
      port: Number(addr.slice(i + 1)),
      servername: u.hostname,
      path: u.pathname + u.search,
      headers: {
        Host: u.host,
        Connection: 'Upgrade',
        Upgrade: 'websocket',
        'Sec-WebSocket-Version': '13',
        'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
        'Sec-WebSocket-Protocol': protocols.join(', '),
      },
      timeout: 30000,
    })
    req.on('response', (res) => reject(new Error(`WebSocket ${url}: HTTP ${res.statusCode}, no upgrade`)))
    req.on('upgrade', (res, socket, head) => {
      let buf = head
      const messages = [], waiting = []
      const parse = () => {
        for (;;) {
          if (buf.length < 2) return
          let len = buf[1] & 0x7f, off = 2
          if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4 }
          if (len === 127) { socket.destroy(new Error('WebSocket frame too large for this test client')); return }
          if (buf.length < off + len) return
          const msg = buf.subarray(off, off + len)
          buf = buf.subarray(off + len)
          if (waiting.length) waiting.shift().resolve(msg)
          else messages.push(msg)
        }
      }
      socket.on('data', (c) => { buf = Buffer.concat([buf, c]); parse() })
      socket.on('close', () => { while (waiting.length) waiting.shift().reject(new Error(`WebSocket ${url}: closed`)) })
      socket.on('error', () => {})
      parse()
      resolve({
        status: res.statusCode,
        protocol: res.headers['sec-websocket-protocol'],
        next(timeoutMs = 30000) {
          if (messages.length) return Promise.resolve(messages.shift())
          return new Promise((res2, rej2) => {
            const timer = setTimeout(() => rej2(new Error(`WebSocket ${url}: no message in ${timeoutMs} ms`)), timeoutMs)
            waiting.push({ resolve: (m) => { clearTimeout(timer); res2(m) }, reject: (e) => { clearTimeout(timer); rej2(e) } })
          })
        },
        send(data) {
          const payload = Buffer.from(data)
          assert.ok(payload.length < 126, 'this test client sends short messages only')
          const mask = randomBytes(4)
          const frame = Buffer.concat([Buffer.from([0x82, 0x80 | payload.length]), mask, payload.map((b, j) => b ^ mask[j % 4])])
          socket.write(frame)
        },
        close() { socket.destroy() },
      })
    })
    req.on('timeout', () => req.destroy(new Error(`WebSocket ${url} via ${addr}: timed out`)))
    req.on('error', reject)
    req.end()
  })
}
