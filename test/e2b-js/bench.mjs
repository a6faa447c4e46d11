// bench.mjs measures @e2b/desktop's screenshot() and leftClick() against a
// running sandbox (CUBICLE_BENCH_SANDBOX), through the unmodified SDK and
// E2B's environment variables, and prints the samples (ms) as JSON on
// stdout. test/bench runs it on the same sandbox it measures natively.
import { Sandbox as Desktop } from '@e2b/desktop'

const id = process.env.CUBICLE_BENCH_SANDBOX
const n = Number(process.env.CUBICLE_BENCH_N || 30)
if (!id) {
  console.error('bench.mjs: set CUBICLE_BENCH_SANDBOX')
  process.exit(2)
}

const desktop = await Desktop.connect(id)
const time = async (f) => {
  const t0 = performance.now()
  await f()
  return performance.now() - t0
}
const out = { screenshot: [], leftClick: [] }
for (let i = 0; i < 3; i++) await desktop.screenshot() // warm up connections
for (let i = 0; i < n; i++) out.screenshot.push(await time(() => desktop.screenshot()))
for (let i = 0; i < n; i++) out.leftClick.push(await time(() => desktop.leftClick(200 + (i % 50), 700)))
console.log(JSON.stringify(out))
