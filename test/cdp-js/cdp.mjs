// Playwright and Puppeteer (playwright-core and puppeteer-core, no browser
// of their own) connected to a
// cubicle sandbox's Chromium through cubicled's CDP endpoint. Run by
// test/e2e TestCDP with:
//   CUBICLE_URL      http://HOST:PORT of cubicled
//   CUBICLE_API_KEY  an API key
//   CUBICLE_TOKEN    a view token (view_only false) of the sandbox
//   CUBICLE_SANDBOX  the sandbox id
//   CUBICLE_PAGE     the URL of a page inside the sandbox to open
// It prints one line "RESULT {json}" with what it saw.
import { chromium } from 'playwright-core';
import puppeteer from 'puppeteer-core';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const base = env('CUBICLE_URL');
const key = env('CUBICLE_API_KEY');
const token = env('CUBICLE_TOKEN');
const id = env('CUBICLE_SANDBOX');
const pageURL = env('CUBICLE_PAGE');
const endpoint = `${base}/v1/sandboxes/${id}/cdp`;
const result = {};

// 1. An http URL carrying only a token: connectOverCDP reads
// /json/version there and follows its webSocketDebuggerUrl.
let t0 = Date.now();
let browser = await chromium.connectOverCDP(`${endpoint}?token=${encodeURIComponent(token)}`, { timeout: 30000 });
result.connectMs = Date.now() - t0;
result.version = browser.version();
const context = browser.contexts()[0];
// The tab on the sandbox's screen.
const page = context.pages()[0] ?? (await context.newPage());
t0 = Date.now();
await page.goto(pageURL);
result.gotoMs = Date.now() - t0;
await page.bringToFront();
result.title = await page.title();
result.heading = await page.textContent('#greeting');
result.items = await page.$$eval('li', (els) => els.map((e) => e.textContent));
await page.evaluate(() => {
  document.body.style.background = 'rgb(255, 0, 255)';
  document.getElementById('greeting').textContent = 'Changed by Playwright';
});
result.background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
// Disconnects; the browser and its tab stay.
await browser.close();

// 2. The WebSocket URL with the API key in a header.
t0 = Date.now();
browser = await chromium.connectOverCDP(endpoint.replace(/^http/, 'ws'), {
  headers: { 'X-API-Key': key },
  timeout: 30000,
});
result.reconnectMs = Date.now() - t0;
const again = browser.contexts()[0].pages().find((p) => p.url() === pageURL);
result.headingAfterReconnect = again ? await again.textContent('#greeting') : null;
await browser.close();

// 3. Puppeteer: browserWSEndpoint with the API key in a header.
t0 = Date.now();
const pb = await puppeteer.connect({
  browserWSEndpoint: endpoint.replace(/^http/, 'ws'),
  headers: { 'X-API-Key': key },
  defaultViewport: null,
});
result.puppeteerConnectMs = Date.now() - t0;
const pp = (await pb.pages()).find((p) => p.url() === pageURL);
result.puppeteerHeading = pp ? await pp.$eval('#greeting', (e) => e.textContent) : null;
if (pp) {
  await pp.evaluate(() => { document.getElementById('greeting').textContent = 'Changed by Puppeteer'; });
  result.puppeteerChanged = await pp.$eval('#greeting', (e) => e.textContent);
}
await pb.disconnect();

console.log('RESULT ' + JSON.stringify(result));
