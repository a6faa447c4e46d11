// The plain e2b SDK, unmodified, against cubicled with E2B's "base"
// template: create; commands (output, exit codes, env, cwd, streaming,
// background, stdin, PTY, users); files; a sandbox port over TLS, WebSockets
// included; lifecycle (getInfo, setTimeout, list, connect, kill, expiry);
// and a wrong API key. Only E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and
// E2B_API_KEY configure the SDK; CUBICLE_TLS_ADDR is where the test reaches
// https://*.E2B_DOMAIN.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { after, before, describe, it } from 'node:test'

import { AuthenticationError, CommandExitError, FileType, InvalidArgumentError, NotFoundError, Sandbox, TimeoutError } from 'e2b'

import { env, fetchVia, imageGap, probe, sleep, waitFor, websocketVia } from './lib.mjs'

const run = randomBytes(6).toString('hex')

describe('e2b SDK, template base', { timeout: 10 * 60 * 1000 }, () => {
  let sbx, created

  before(async () => {
    // No timeoutMs: the sandbox gets E2B's default timeout (the SDK
    // sends none; the API's default is 300 s). Then 10 minutes, so that
    // the suite has the time it needs.
    sbx = await Sandbox.create('base', {
      envs: { CUBICLE_CREATE_ENV: 'from create' },
      metadata: { suite: 'cubicle-e2b-js', run },
    })
    created = await sbx.getInfo()
    await sbx.setTimeout(10 * 60 * 1000)
  })

  after(async () => {
    // Whatever failed, leave nothing running (the Go test checks).
    if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  })

  it('create returns a sandbox on the configured domain', () => {
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
    assert.equal(sbx.sandboxDomain, env('E2B_DOMAIN'))
    assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${env('E2B_DOMAIN')}`)
  })

  it('create without timeoutMs: the sandbox ends after E2B\'s default 300 s', () => {
    const life = created.endAt.getTime() - created.startedAt.getTime()
    assert.ok(Math.abs(life - 300 * 1000) <= 2000, `the sandbox was made to live ${life} ms, want E2B's default 300 000 ms`)
  })

  it('commands.run: stdout, stderr, exit code 0', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2; printf "ünïcödé ✓"')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\nünïcödé ✓')
    assert.equal(r.stderr, 'err\n')
    assert.equal(r.error, undefined)
  })

  it('commands.run: a non-zero exit throws CommandExitError', async () => {
    await assert.rejects(sbx.commands.run('echo before; echo oops >&2; exit 7'), (e) => {
      assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
      assert.equal(e.exitCode, 7)
      assert.equal(e.stdout, 'before\n')
      assert.equal(e.stderr, 'oops\n')
      return true
    })
  })

  it('commands.run: env vars from create and from the command', async () => {
    const r = await sbx.commands.run('echo "$CUBICLE_CREATE_ENV|$CMD_ENV|$HOME"', { envs: { CMD_ENV: 'from command' } })
    assert.match(r.stdout, /^from create\|from command\|\/.+\n$/)
    // The command's own envs override the sandbox's.
    const o = await sbx.commands.run('echo "$CUBICLE_CREATE_ENV"', { envs: { CUBICLE_CREATE_ENV: 'overridden' } })
    assert.equal(o.stdout, 'overridden\n')
  })

  it('commands.run: cwd', async () => {
    await sbx.files.makeDir(`/tmp/cwd-${run}`)
    const r = await sbx.commands.run('pwd', { cwd: `/tmp/cwd-${run}` })
    assert.equal(r.stdout, `/tmp/cwd-${run}\n`)
  })

  it('commands.run: output is streamed to onStdout/onStderr as it comes', async () => {
    const out = [], err = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => err.push(d),
    })
    assert.equal(out.join(''), 'o1\no2\no3\n')
    assert.equal(err.join(''), 'e1\ne2\ne3\n')
    assert.ok(out.length >= 2, `stdout came in ${out.length} chunk(s), want it streamed`)
    assert.equal(r.stdout, 'o1\no2\no3\n')
  })

  it('commands.run: a command outlives its request timeout, which covers only its start', async () => {
    // requestTimeoutMs (60 s by default) bounds a command's request until
    // the start event; timeoutMs bounds the command. Shortened to 1 s here
    // so that the test takes seconds, not minutes: a 2 s command must still
    // run to its end. A daemon that held the stream back (the start event
    // with the output, at the end) would have the SDK abort it after 1 s,
    // a second before the command could end.
    const t0 = Date.now()
    const r = await sbx.commands.run('sleep 2; echo done', { requestTimeoutMs: 1000, timeoutMs: 30000 })
    assert.equal(r.stdout, 'done\n')
    assert.ok(Date.now() - t0 >= 2000, `a 2 s command came back after ${Date.now() - t0} ms`)
  })

  it('commands.run: timeoutMs is the command\'s time limit, enforced in the sandbox', async () => {
    // The SDK sends timeoutMs as Connect-Timeout-Ms, which envd takes as
    // the process's deadline. The SDK also gives up itself at that time,
    // so what shows that the daemon honoured it is the process: killed,
    // not left running after the SDK stopped waiting.
    const marker = `timeout-${run}`
    const mine = async () => (await sbx.commands.list()).filter((p) => p.args.join(' ').includes(marker))
    const t0 = Date.now()
    await assert.rejects(sbx.commands.run(`sleep 30; echo ${marker}`, { timeoutMs: 2000 }), (e) => {
      assert.ok(e instanceof TimeoutError || e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
      return true
    })
    const took = Date.now() - t0
    assert.ok(took >= 1900 && took < 15000, `gave up after ${took} ms, want about 2 s`)
    await waitFor('the timed-out command gone from commands.list()', async () => (await mine()).length === 0, 10000)
      .catch(async (e) => assert.fail(`${e.message}: still running ${JSON.stringify(await mine())}`))
    const ps = await probe(sbx, 'ps -eo args | grep -c "^sleep 30$"')
    assert.equal(ps.stdout.trim(), '0', 'a sleep 30 still runs in the sandbox after its command timed out')
  })

  it('commands.run: 300 short commands in a row, none cut off', async () => {
    // A desktop agent runs hundreds of these (every click is one); each
    // must come back whole.
    const failures = []
    for (let i = 0; i < 300; i++) {
      try {
        const r = await sbx.commands.run(`echo ${i}`)
        if (r.stdout !== `${i}\n`) failures.push(`#${i}: stdout ${JSON.stringify(r.stdout)}`)
      } catch (e) {
        failures.push(`#${i}: ${e.constructor.name}: ${e.message}`)
      }
    }
    assert.deepEqual(failures, [], `${failures.length} of 300 commands failed`)
  })

  it('background command: list, kill, and wait after kill', async () => {
    const h = await sbx.commands.run(`sleep 600; echo never-${run}`, { background: true })
    assert.ok(h.pid > 0, `pid ${h.pid}`)
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === h.pid), `pid ${h.pid} not in commands.list(): ${JSON.stringify(listed.map((p) => p.pid))}`)
    assert.equal(await h.kill(), true)
    await assert.rejects(h.wait(), (e) => {
      assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
      assert.notEqual(e.exitCode, 0)
      return true
    })
    await waitFor('killed process gone from commands.list()', async () =>
      !(await sbx.commands.list()).some((p) => p.pid === h.pid))
    // Killing it again finds nothing.
    assert.equal(await sbx.commands.kill(h.pid), false)
  })

  it('background command: survives disconnect; commands.kill by pid', async () => {
    const h = await sbx.commands.run(`sleep 600`, { background: true })
    await h.disconnect()
    const r = await sbx.commands.run(`kill -0 ${h.pid} && echo alive`)
    assert.equal(r.stdout, 'alive\n')
    assert.equal(await sbx.commands.kill(h.pid), true)
    await waitFor('killed process gone', async () => (await probe(sbx, `kill -0 ${h.pid}`)).exitCode !== 0)
  })

  it('background command: wait returns its output', async () => {
    const h = await sbx.commands.run('sleep 1; echo finished', { background: true })
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'finished\n')
  })

  it('background command: commands.connect re-attaches to its output', async () => {
    const h = await sbx.commands.run('sleep 1; echo late', { background: true })
    await h.disconnect()
    const again = await sbx.commands.connect(h.pid)
    const r = await again.wait()
    assert.equal(r.stdout, 'late\n')
  })

  it('stdin: sendStdin and closeStdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'line one\n')
    await sbx.commands.sendStdin(h.pid, 'line two ✓\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'line one\nline two ✓\n')
  })

  it('pty: create, sendInput, resize, kill', async () => {
    let out = ''
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += Buffer.from(d).toString() }, timeoutMs: 0 })
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'))
    const seen = (what, ...parts) => waitFor(what, () => parts.every((p) => out.includes(p)), 15000)
      .catch((e) => assert.fail(`${e.message}; pty output so far: ${JSON.stringify(out)}`))
    await seen('pty output', 'pty-42', '24 80')
    await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'))
    await seen('pty resized', '30 100')
    assert.equal(await sbx.pty.kill(pty.pid), true)
  })

  it('users: "user" by default, as in E2B\'s templates; root when asked', async () => {
    const def = await sbx.commands.run('id -un; echo $HOME; pwd')
    assert.equal(def.stdout, 'user\n/home/user\n/home/user\n')
    const root = await sbx.commands.run('id -un; echo $HOME; pwd', { user: 'root' })
    assert.equal(root.stdout, 'root\n/root\n/root\n')
    // find, not stat: coreutils' statx flags are EINVAL on older gVisor.
    const owner = async (path) => (await sbx.commands.run(`find ${path} -printf '%u\\n'`)).stdout.trim()
    // Files are written for the user, as envd does: as root, then chowned.
    const mine = await sbx.files.write(`/tmp/owned-${run}`, 'x')
    assert.equal(await owner(mine.path), 'user')
    const roots = await sbx.files.write(`/tmp/owned-root-${run}`, 'x', { user: 'root' })
    assert.equal(await owner(roots.path), 'root')
  })

  it('files: write/read text and bytes, list, exists, makeDir, rename, remove', async () => {
    const dir = `/tmp/files-${run}`
    assert.equal(await sbx.files.makeDir(dir), true)
    assert.equal(await sbx.files.makeDir(dir), false, 'makeDir of an existing dir')
    assert.equal(await sbx.files.exists(dir), true)

    const text = 'hello from e2b ✓\n'
    const info = await sbx.files.write(`${dir}/a.txt`, text)
    assert.equal(info.path, `${dir}/a.txt`)
    assert.equal(info.name, 'a.txt')
    assert.equal(await sbx.files.read(`${dir}/a.txt`), text)

    const bytes = new Uint8Array(300000).map((_, i) => (i * 7 + 3) & 0xff)
    await sbx.files.write(`${dir}/sub/deeper/b.bin`, bytes)
    const back = await sbx.files.read(`${dir}/sub/deeper/b.bin`, { format: 'bytes' })
    assert.ok(Buffer.from(back).equals(Buffer.from(bytes)), `read ${back.length} bytes, want the ${bytes.length} written`)

    await sbx.files.write(`${dir}/empty`, '')
    assert.equal(await sbx.files.read(`${dir}/empty`), '')

    const many = await sbx.files.write([
      { path: `${dir}/m1.txt`, data: 'one' },
      { path: `${dir}/m2.txt`, data: 'two' },
    ])
    assert.deepEqual(many.map((f) => f.name).sort(), ['m1.txt', 'm2.txt'])

    const entries = await sbx.files.list(dir)
    const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
    assert.deepEqual(Object.keys(byName).sort(), ['a.txt', 'empty', 'm1.txt', 'm2.txt', 'sub'])
    assert.equal(byName['a.txt'].type, FileType.FILE)
    assert.equal(byName['a.txt'].size, Buffer.byteLength(text))
    assert.equal(byName['a.txt'].path, `${dir}/a.txt`)
    assert.equal(byName.sub.type, FileType.DIR)
    const deep = await sbx.files.list(dir, { depth: 3 })
    assert.ok(deep.some((e) => e.path === `${dir}/sub/deeper/b.bin`), 'list depth 3 finds sub/deeper/b.bin')

    // The sandbox's shell sees the same files.
    assert.equal((await sbx.commands.run(`cat ${dir}/m2.txt`)).stdout, 'two')

    const moved = await sbx.files.rename(`${dir}/m1.txt`, `${dir}/renamed.txt`)
    assert.equal(moved.path, `${dir}/renamed.txt`)
    assert.equal(await sbx.files.exists(`${dir}/m1.txt`), false)

    await sbx.files.remove(`${dir}/a.txt`)
    assert.equal(await sbx.files.exists(`${dir}/a.txt`), false)
    await assert.rejects(sbx.files.read(`${dir}/a.txt`), (e) => e.name === 'NotFoundError' || e.name === 'FileNotFoundError')
    await sbx.files.remove(dir)
    assert.equal(await sbx.files.exists(dir), false)
  })

  it('files.watchDir: a write, a rename and a remove, recursive or not; stop frees the watch; bad paths refused', async () => {
    // A relative path is taken from the user's home, as envd does.
    const dir = `watch-${run}`
    await sbx.files.makeDir(dir)
    // The agent's inotify instances: one a watch, none once it stops.
    const agentInotify = async () => Number((await sbx.commands.run(
      'find /proc/$(pgrep -o -f /opt/cubicle/bin/cubicle-agent)/fd -mindepth 1 -printf "%l\\n" | grep -c inotify || true', { user: 'root' })).stdout.trim())
    const before = await agentInotify()

    const deep = []
    const flat = []
    const exits = []
    const show = (e) => `${e.type} ${e.name}`
    const deepHandle = await sbx.files.watchDir(dir, (e) => { deep.push(show(e)) }, { recursive: true, onExit: (err) => { exits.push(err) } })
    const flatHandle = await sbx.files.watchDir(`/home/user/${dir}`, (e) => { flat.push(show(e)) })
    assert.equal(await agentInotify(), before + 2, 'inotify instances in the agent with two watches')

    // What a program in the sandbox does, then what the SDK does.
    await sbx.commands.run(`echo one > ${dir}/a.txt && mv ${dir}/a.txt ${dir}/b.txt && mkdir ${dir}/sub && sleep 0.3 && echo two > ${dir}/sub/c.txt`)
    await sbx.files.write(`${dir}/up.txt`, 'uploaded')
    await sbx.files.remove(`${dir}/b.txt`)
    await sbx.commands.run(`touch ${dir}/end`) // events come in order: after this one, all are in
    await waitFor('both watches to see the end file', () => deep.includes('create end') && flat.includes('create end'), 15000, 100)

    const inOrder = (got, want) => {
      let i = 0
      for (const g of got) if (g === want[i]) i++
      return i === want.length
    }
    const top = ['create a.txt', 'write a.txt', 'rename a.txt', 'create b.txt', 'create sub']
    const after = ['create up.txt', 'write up.txt', 'remove b.txt', 'create end']
    assert.ok(inOrder(deep, [...top, 'create sub/c.txt', 'write sub/c.txt', ...after]), `recursive watch saw ${JSON.stringify(deep)}`)
    assert.ok(inOrder(flat, [...top, ...after]), `watch saw ${JSON.stringify(flat)}`)
    assert.ok(!flat.some((e) => e.includes('sub/')), `a watch that is not recursive reported the subdirectory's events: ${JSON.stringify(flat)}`)
    assert.ok(![...deep, ...flat].some((e) => e.includes('.cubicle-')), 'an upload\'s temporary file was reported')

    // stop ends the stream and the agent frees the watch at once.
    await deepHandle.stop()
    await flatHandle.stop()
    await waitFor('the agent to free both watches', async () => (await agentInotify()) === before, 10000, 200)
    const n = deep.length
    await sbx.commands.run(`touch ${dir}/late`)
    await sleep(500)
    assert.equal(deep.length, n, `events after stop: ${JSON.stringify(deep.slice(n))}`)

    await assert.rejects(sbx.files.watchDir(`${dir}/missing`, () => {}), (e) => {
      assert.ok(e instanceof NotFoundError, `${e?.constructor?.name}: ${e?.message}`)
      return true
    })
    await assert.rejects(sbx.files.watchDir(`${dir}/end`, () => {}), (e) => {
      assert.ok(e instanceof InvalidArgumentError, `${e?.constructor?.name}: ${e?.message}`)
      return true
    })
  })

  it('files watchers, polling form (envd CreateWatcher / GetWatcherEvents / RemoveWatcher, which E2B\'s Python SDK uses; through the JS SDK\'s own envd client)', async () => {
    const dir = `/tmp/poll-${run}`
    await sbx.files.makeDir(dir)
    const rpc = sbx.files.rpc
    const { watcherId } = await rpc.createWatcher({ path: dir, recursive: true })
    assert.match(watcherId, /^w/)
    await sbx.commands.run(`echo x > ${dir}/f && mv ${dir}/f ${dir}/g && rm ${dir}/g`)
    const names = ['', 'create', 'write', 'remove', 'rename', 'chmod']
    const got = []
    await waitFor('the polled events', async () => {
      const { events } = await rpc.getWatcherEvents({ watcherId })
      got.push(...events.map((e) => `${names[e.type]} ${e.name}`))
      return got.includes('remove g')
    }, 15000, 200)
    assert.deepEqual(got, ['create f', 'write f', 'rename f', 'create g', 'remove g'])
    assert.deepEqual((await rpc.getWatcherEvents({ watcherId })).events, [], 'each event is handed out once')
    await rpc.removeWatcher({ watcherId })
    await assert.rejects(rpc.getWatcherEvents({ watcherId }), (e) => e.code === 5) // Connect's not_found
  })

  it('getHost(port): https://<port>-<id>.<domain> reaches a sandbox port, WebSockets too', async (t) => {
    const py = await probe(sbx, 'command -v python3')
    const gap = imageGap(py.exitCode === 0 ? [] : ['no python3 in the image to run testserver.py'])
    if (gap) return t.skip(gap)
    const dir = `/tmp/www-${run}`
    await sbx.files.write(`${dir}/hello.txt`, `hello ${run}`)
    await sbx.files.write(`/tmp/testserver-${run}.py`, readFileSync(new URL('./testserver.py', import.meta.url)))
    const server = await sbx.commands.run(`exec python3 /tmp/testserver-${run}.py 8123 ${dir}`, { background: true, timeoutMs: 0 })
    const tls = env('CUBICLE_TLS_ADDR')
    try {
      const url = `https://${sbx.getHost(8123)}/hello.txt`
      const res = await waitFor(`${url} answers`, async () => {
        const r = await fetchVia(tls, url).catch((e) => ({ status: 0, body: String(e) }))
        return r.status === 200 ? r : null
      })
      assert.equal(res.body, `hello ${run}`)

      // A WebSocket upgrade through the daemon both ways, as noVNC's
      // /websockify needs.
      const ws = await websocketVia(tls, `https://${sbx.getHost(8123)}/websockify`)
      try {
        assert.equal(ws.status, 101)
        assert.equal(ws.protocol, 'binary')
        assert.equal((await ws.next()).toString(), 'RFB 003.008\n')
        ws.send('ping ✓')
        assert.equal((await ws.next()).toString(), 'ping ✓')
      } finally {
        ws.close()
      }

      // A port nothing listens on is a 502, not a hang.
      const closed = await fetchVia(tls, `https://${sbx.getHost(8124)}/`)
      assert.equal(closed.status, 502)
    } finally {
      await server.kill()
    }
  })

  it('getMetrics: samples while the sandbox burns CPU, and plausible ones', async () => {
    // cubicled samples every 5 s by default, measured from the host (the
    // sandbox's cgroup, or its VM's process). A shell spinning on a
    // builtin keeps one core busy.
    const burner = await sbx.commands.run('while :; do :; done', { background: true })
    try {
      const since = new Date()
      let ms = []
      await waitFor('two samples of the burning sandbox', async () => {
        ms = await sbx.getMetrics({ start: since })
        return ms.length >= 2
      }, 60000, 1000)
      for (const m of ms) {
        assert.ok(m.timestamp instanceof Date && m.timestamp.getTime() >= since.getTime() - 1000 && m.timestamp.getTime() <= Date.now() + 1000,
          `sample time ${m.timestamp} is not between the start of the burner and now`)
        assert.ok(Number.isInteger(m.cpuCount) && m.cpuCount >= 1, `cpuCount ${m.cpuCount}`)
        assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
        assert.ok(m.memTotal >= 256 * 2 ** 20 && m.memUsed >= 2 ** 20 && m.memUsed <= m.memTotal, `memory ${m.memUsed} of ${m.memTotal}`)
        assert.ok(m.memCache >= 0, `memCache ${m.memCache}`)
        assert.ok(m.diskUsed >= 0 && (m.diskTotal === 0 || m.diskUsed <= m.diskTotal), `disk ${m.diskUsed} of ${m.diskTotal}`)
      }
      // One core of cpuCount is 100/cpuCount %; other work on a busy
      // host can leave the burner a fifth of that.
      const busiest = Math.max(...ms.map((m) => m.cpuUsedPct))
      assert.ok(busiest >= 20 / ms[0].cpuCount, `the burning sandbox's cpuUsedPct peaked at ${busiest} (cpuCount ${ms[0].cpuCount})`)
      // The window: nothing from before start, everything up to end.
      const upTo = await sbx.getMetrics({ start: since, end: ms[0].timestamp })
      assert.equal(upTo.length, 1, `start..first sample: ${upTo.length} samples`)
    } finally {
      await burner.kill()
    }
  })

  it('getInfo and setTimeout', async () => {
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { suite: 'cubicle-e2b-js', run })
    assert.ok(info.endAt > info.startedAt, `endAt ${info.endAt} after startedAt ${info.startedAt}`)
    await sbx.setTimeout(15 * 60 * 1000)
    const later = await sbx.getInfo()
    const left = later.endAt.getTime() - Date.now()
    assert.ok(left > 10 * 60 * 1000 && left <= 15 * 60 * 1000 + 5000, `after setTimeout(15 min) the sandbox ends in ${left} ms`)
    await sbx.setTimeout(5 * 60 * 1000)
    const shorter = await sbx.getInfo()
    assert.ok(shorter.endAt < later.endAt, 'setTimeout can shorten the timeout')
    const stat = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(stat.sandboxId, sbx.sandboxId)
  })

  it('Sandbox.list finds it, by metadata too', async () => {
    const all = await Sandbox.list().nextItems()
    assert.ok(all.some((s) => s.sandboxId === sbx.sandboxId), 'Sandbox.list() lists the sandbox')
    const mine = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
    assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.equal(mine[0].state, 'running')
    const running = await Sandbox.list({ query: { state: ['running'], metadata: { run } } }).nextItems()
    assert.deepEqual(running.map((s) => s.sandboxId), [sbx.sandboxId])
    const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { run } } }).nextItems()
    assert.deepEqual(paused, [])
    const none = await Sandbox.list({ query: { metadata: { run: 'no-such-run' } } }).nextItems()
    assert.deepEqual(none, [])
  })

  it('Sandbox.connect gives a working handle', async () => {
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal((await again.commands.run('echo connected')).stdout, 'connected\n')
    assert.equal(await again.isRunning(), true)
  })

  it('kill: the sandbox is gone; a second kill is false', async () => {
    const id = sbx.sandboxId
    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
    assert.equal(await Sandbox.kill(id), false)
    await assert.rejects(Sandbox.connect(id), (e) => e.name === 'SandboxNotFoundError' || e.name === 'NotFoundError')
    const mine = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
    assert.deepEqual(mine, [], 'a killed sandbox is not listed')
    sbx = null
  })
})

describe('e2b SDK, sandbox timeout', () => {
  it('a sandbox is killed when its timeout runs out', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 5000, metadata: { suite: 'cubicle-e2b-js', run: `${run}-short` } })
    try {
      assert.equal((await sbx.commands.run('echo up')).stdout, 'up\n')
      const t0 = Date.now()
      await waitFor('the sandbox stopped at its timeout', async () => !(await sbx.isRunning()), 60000, 500)
      const after = Date.now() - t0
      assert.ok(after < 30000, `stopped ${after} ms after the check, want about 5 s after create`)
      const listed = await Sandbox.list({ query: { metadata: { run: `${run}-short` } } }).nextItems()
      assert.deepEqual(listed, [], 'a timed-out sandbox is not listed')
      assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
    }
  })
})

describe('e2b SDK, wrong API key', () => {
  const wrong = { apiKey: 'e2b_' + '0'.repeat(40) }

  it('Sandbox.create throws AuthenticationError', async () => {
    await assert.rejects(Sandbox.create('base', wrong), (e) => {
      assert.ok(e instanceof AuthenticationError, `${e?.constructor?.name}: ${e?.message}`)
      return true
    })
  })

  it('Sandbox.list throws AuthenticationError', async () => {
    await assert.rejects(Sandbox.list(wrong).nextItems(), AuthenticationError)
  })

  it('Sandbox.connect throws AuthenticationError', async () => {
    await assert.rejects(Sandbox.connect('aaaaaaaaaaaaaaaaaaaa', wrong), AuthenticationError)
  })
})

describe('e2b SDK, pause and resume', { timeout: 10 * 60 * 1000 }, () => {
  it('pause, list as paused, connect resumes with memory and files', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 5 * 60 * 1000, metadata: { suite: 'cubicle-e2b-js', run: `${run}-pause` } })
    try {
      // In memory only (/tmp is a tmpfs), and a process with a shell
      // variable that counts.
      await sbx.commands.run('echo kept > /tmp/paused-file')
      const bg = await sbx.commands.run('i=0; while :; do i=$((i+1)); echo $i > /tmp/count.part; mv /tmp/count.part /tmp/count; sleep 0.2; done', { background: true })
      await waitFor('the counter', async () => (await sbx.commands.run('cat /tmp/count || true')).stdout.trim() !== '')
      const before = Number((await sbx.commands.run('cat /tmp/count')).stdout)
      assert.equal(await sbx.pause(), true)
      assert.equal((await sbx.getInfo()).state, 'paused')
      assert.equal(await Sandbox.pause(sbx.sandboxId), false, 'a second pause is false (already paused)')
      const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { run: `${run}-pause` } } }).nextItems()
      assert.deepEqual(paused.map((s) => [s.sandboxId, s.state]), [[sbx.sandboxId, 'paused']])
      const running = await Sandbox.list({ query: { state: ['running'], metadata: { run: `${run}-pause` } } }).nextItems()
      assert.deepEqual(running, [])

      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 4 * 60 * 1000 })
      assert.equal(again.sandboxId, sbx.sandboxId)
      assert.equal((await again.getInfo()).state, 'running')
      assert.equal((await again.commands.run('cat /tmp/paused-file')).stdout, 'kept\n')
      const after = Number((await again.commands.run('cat /tmp/count')).stdout)
      assert.ok(after >= before, `the counter is ${after} after resume, ${before} before the pause: its process started over`)
      await waitFor('the counter to go on', async () => Number((await again.commands.run('cat /tmp/count')).stdout) > after)
      assert.equal((await again.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout, 'alive\n')
      // connect of a running sandbox leaves it running.
      const third = await Sandbox.connect(sbx.sandboxId)
      assert.equal(await third.isRunning(), true)
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
    }
  })

  it('lifecycle onTimeout pause (autoPause): the timeout pauses; connect resumes', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 5000, lifecycle: { onTimeout: 'pause' }, metadata: { suite: 'cubicle-e2b-js', run: `${run}-autopause` } })
    try {
      await sbx.commands.run('echo survived > /tmp/autopause')
      assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause')
      await waitFor('the sandbox paused at its timeout', async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 60000, 500)
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60 * 1000 })
      assert.equal((await again.commands.run('cat /tmp/autopause')).stdout, 'survived\n')
      const info = await again.getInfo()
      const left = info.endAt.getTime() - Date.now()
      assert.ok(left > 30 * 1000 && left <= 61 * 1000, `connect({timeoutMs: 60 s}) left ${left} ms`)
    } finally {
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
    }
  })
})

// forkCount is how many forks the fork test asks for in one call:
// CUBICLE_E2E_FORKS (the Go TestFork's knob, which reaches node through
// TestE2BSDK's environment), default 2, and never fewer than the two it
// takes to try one fork's envd token on another.
const forkCount = Math.max(2, Number.parseInt(process.env.CUBICLE_E2E_FORKS ?? '', 10) || 2)

describe('e2b SDK, fork', { timeout: 15 * 60 * 1000 }, () => {
  it('fork({count}) and createSnapshot() on gvisor (the default backend) and qemu: copies with files, processes and their own ids, machine-ids and envd tokens, and snapshots that Sandbox.create starts from', async (t) => {
    const made = []
    try {
      // The SDK's own sandbox, on the daemon's default backend (gvisor).
      const g = await Sandbox.create('base', { metadata: { suite: 'cubicle-e2b-js', run: `${run}-fork` } })
      made.push(g.sandboxId)
      await forksAndSnapshots(g, made)

      const info = await (await fetch(`${env('E2B_API_URL')}/v1/info`, { headers: { 'X-API-Key': env('E2B_API_KEY') } })).json()
      const qemu = info.backends.find((b) => b.name === 'qemu')
      if (!qemu?.available && process.env.CUBICLE_REQUIRE_E2E !== '1') {
        t.diagnostic(`qemu is not available here: ${qemu?.reason}`)
        return
      }
      // E2B's create has no backend to choose, so the qemu parent is
      // made with cubicle's own API; the SDK connects to it and forks it.
      const res = await fetch(`${env('E2B_API_URL')}/v1/sandboxes`, {
        method: 'POST',
        headers: { 'X-API-Key': env('E2B_API_KEY'), 'Content-Type': 'application/json' },
        body: JSON.stringify({ backend: 'qemu', memory_mb: 1536, metadata: { suite: 'cubicle-e2b-js', run: `${run}-fork` } }),
      })
      assert.equal(res.status, 201, await res.clone().text())
      const { id } = await res.json()
      made.push(id)
      await forksAndSnapshots(await Sandbox.connect(id, { timeoutMs: 10 * 60 * 1000 }), made)
    } finally {
      for (const sid of made) await Sandbox.kill(sid).catch(() => {})
    }
  })
})

// forksAndSnapshots forks parent and snapshots it through the SDK, and
// checks what each copy holds and what is its own; made gets every
// sandbox it starts.
async function forksAndSnapshots (parent, made) {
  const tls = env('CUBICLE_TLS_ADDR')
  await parent.commands.run('echo before-fork > /home/user/fork-file')
  // timeoutMs: 0, or envd ends the counter after the SDK's default 60 s,
  // which a slow machine reaches before the snapshot below.
  const bg = await parent.commands.run('i=0; while :; do i=$((i+1)); echo $i > /tmp/n.part; mv /tmp/n.part /tmp/n; sleep 0.2; done', { background: true, timeoutMs: 0 })
  await waitFor('the counter', async () => (await probe(parent, 'cat /tmp/n')).stdout.trim() !== '')
  const parentMachineID = (await parent.commands.run('cat /etc/machine-id')).stdout

  const forks = await parent.fork({ count: forkCount, timeoutMs: 5 * 60 * 1000 })
  assert.equal(forks.length, forkCount)
  for (const f of forks) {
    assert.ok(!(f instanceof Error), `a fork failed: ${f}`)
    made.push(f.sandboxId)
  }
  const ids = new Set([parent.sandboxId, ...forks.map((f) => f.sandboxId)])
  assert.equal(ids.size, forkCount + 1, 'every fork has an id of its own')
  const machineIDs = new Set([parentMachineID])
  for (const f of forks) {
    assert.equal((await f.getInfo()).state, 'running')
    assert.equal((await f.commands.run('cat /home/user/fork-file')).stdout, 'before-fork\n')
    // The parent's background process was copied and counts on.
    assert.equal((await f.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout, 'alive\n')
    const n = Number((await f.commands.run('cat /tmp/n')).stdout)
    await waitFor('the copied counter to go on', async () => Number((await f.commands.run('cat /tmp/n')).stdout) > n)
    machineIDs.add((await f.commands.run('cat /etc/machine-id')).stdout)
    await f.commands.run(`echo ${f.sandboxId} > /home/user/fork-file`)
  }
  assert.equal(machineIDs.size, forkCount + 1, 'the parent and each fork have a machine-id of their own')
  assert.equal((await parent.commands.run('cat /home/user/fork-file')).stdout, 'before-fork\n', 'a fork wrote to the parent\'s disk')
  assert.equal((await forks[0].commands.run('cat /home/user/fork-file')).stdout, `${forks[0].sandboxId}\n`, 'one fork wrote to another\'s disk')
  // Each envd token opens its own sandbox only.
  const [a, b] = forks
  const path = '/files?path=/home/user/fork-file&username=user'
  const own = await fetchVia(tls, `https://${a.getHost(49983)}${path}`, { 'X-Access-Token': a.envdAccessToken })
  assert.equal(own.status, 200, own.body)
  for (const [what, token] of [["the other fork's", b.envdAccessToken], ["the parent's", parent.envdAccessToken]]) {
    const r = await fetchVia(tls, `https://${a.getHost(49983)}${path}`, { 'X-Access-Token': token })
    assert.equal(r.status, 401, `fork ${a.sandboxId} with ${what} envd token: ${r.status} ${r.body}`)
  }
  // Done with the forks: under TCG each running VM (each with its
  // copy of the counter) takes CPU from the snapshot and the copies
  // below, so from here on the parent runs with one copy at most.
  for (const f of forks) assert.equal(await f.kill(), true, `kill fork ${f.sandboxId}`)

  // A snapshot of the parent is a template: Sandbox.create(snapshotId)
  // starts a copy of it as it was, by ID or by name, and deleting it
  // is deleting that template.
  const name = `snap-${run}`
  const snap = await parent.createSnapshot({ name })
  assert.ok(snap.snapshotId, 'a snapshot id')
  assert.deepEqual(snap.names, [name])
  await parent.commands.run('echo after-snapshot > /home/user/fork-file')
  const listed = await Sandbox.listSnapshots({ sandboxId: parent.sandboxId }).nextItems()
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])
  const machineIDsNow = new Set(machineIDs)
  for (const ref of [snap.snapshotId, name]) {
    const c = await Sandbox.create(ref, { timeoutMs: 5 * 60 * 1000, metadata: { suite: 'cubicle-e2b-js', run: `${run}-fork` } })
    made.push(c.sandboxId)
    assert.equal((await c.getInfo()).state, 'running')
    assert.equal((await c.commands.run('cat /home/user/fork-file')).stdout, 'before-fork\n', `${ref}: the file as it was at the snapshot`)
    assert.equal((await c.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout, 'alive\n', `${ref}: the counter of the snapshot runs`)
    const mid = (await c.commands.run('cat /etc/machine-id')).stdout
    assert.ok(!machineIDsNow.has(mid), `${ref}: a machine-id of its own`)
    machineIDsNow.add(mid)
    // One copy at a time (TestSnapshot runs copies of one snapshot
    // side by side).
    assert.equal(await c.kill(), true, `${ref}: kill the copy`)
  }
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'a second delete finds nothing')
  assert.deepEqual(await Sandbox.listSnapshots({ sandboxId: parent.sandboxId }).nextItems(), [])
}
