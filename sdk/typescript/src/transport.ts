/**
 * The HTTP layer of the SDK: one request with its headers, its error
 * answer turned into a CubicleError, and bounded retries of idempotent
 * calls. Internal: the Cubicle class is the public face.
 */

import { ConnectionError, CubicleError, parseErrorBody } from "./errors.js";

/** How idempotent calls are retried. */
export interface RetryOptions {
  /** Extra attempts after the first (default 3; 0 turns retries off). */
  maxRetries?: number;
  /** The wait before the first retry, doubling for each next one, with jitter (default 200 ms). */
  baseDelayMs?: number;
  /**
   * The longest single wait (default 10 s). A 429 or 503 whose
   * Retry-After asks for longer is not retried: its error is thrown, with
   * retryAfterMs set, for the caller to decide.
   */
  maxDelayMs?: number;
}

/** The fetch function the SDK calls; the global fetch by default. */
export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

/** The transport's settings, resolved by the Cubicle constructor. */
export interface TransportConfig {
  baseUrl: string;
  apiKey: string | undefined;
  timeoutMs: number | undefined;
  retry: Required<RetryOptions>;
  fetch: FetchLike;
  headers: Record<string, string>;
}

/** One API call. */
export interface RequestSpec {
  method: "GET" | "POST" | "PUT" | "DELETE";
  /** The path, already escaped, e.g. "/v1/sandboxes/abc/exec". */
  path: string;
  query?: URLSearchParams | undefined;
  /** A JSON body (encoded here) … */
  json?: unknown;
  /** … or raw bytes. A ReadableStream can be sent only once, so it turns retries off. */
  body?: string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | undefined;
  contentType?: string;
  accept?: string;
  /** The call is idempotent and may be retried. */
  idempotent: boolean;
  /** The call streams for as long as its command runs: the client's timeoutMs does not apply. */
  streaming?: boolean;
  signal?: AbortSignal | undefined;
}

/** Statuses worth retrying for an idempotent call. */
const retryStatuses = new Set([429, 502, 503, 504]);

/** maxErrorBody bounds how much of an error answer is read. */
const maxErrorBody = 64 << 10;

export class Transport {
  readonly config: TransportConfig;

  constructor(config: TransportConfig) {
    this.config = config;
  }

  /**
   * call performs spec and hands the 2xx response to read, retrying the
   * whole (request and read) as the policy allows. Any other status
   * becomes a CubicleError; no answer at all a ConnectionError; an abort
   * the signal's reason.
   */
  async call<T>(spec: RequestSpec, read: (res: Response) => Promise<T>): Promise<T> {
    const signal = this.signalFor(spec);
    const url = this.url(spec);
    const canRetry = spec.idempotent && !(spec.body instanceof ReadableStream);
    const attempts = 1 + (canRetry ? this.config.retry.maxRetries : 0);
    const encoded = spec.json === undefined ? undefined : JSON.stringify(spec.json);
    let lastErr: unknown;
    for (let i = 0; i < attempts; i++) {
      if (i > 0) {
        const wait = this.backoff(i, lastErr);
        if (wait === undefined) {
          break;
        }
        await sleep(wait, signal);
      }
      try {
        const res = await this.attempt(spec, url, encoded, signal);
        try {
          return await read(res);
        } catch (err) {
          throw connectionError(err, signal, `${spec.method} ${spec.path}: read answer`);
        }
      } catch (err) {
        lastErr = err;
        if (!retryable(err) || signal?.aborted) {
          throw err;
        }
      }
    }
    throw lastErr;
  }

  /** attempt sends one request and returns its response if 2xx; throws otherwise. */
  private async attempt(spec: RequestSpec, url: string, encoded: string | undefined, signal: AbortSignal | undefined): Promise<Response> {
    const headers: Record<string, string> = { ...this.config.headers };
    if (this.config.apiKey) {
      headers["X-API-Key"] = this.config.apiKey;
    }
    headers["Accept"] = spec.accept ?? "application/json";
    let body: RequestInit["body"];
    if (encoded !== undefined) {
      body = encoded;
      headers["Content-Type"] = spec.contentType ?? "application/json";
    } else if (spec.body !== undefined) {
      body = spec.body as RequestInit["body"];
      headers["Content-Type"] = spec.contentType ?? "application/octet-stream";
    }
    const init: RequestInit & { duplex?: "half" } = { method: spec.method, headers, body: body ?? null };
    if (signal) {
      init.signal = signal;
    }
    if (spec.body instanceof ReadableStream) {
      init.duplex = "half"; // Node's fetch requires it to send a stream.
    }
    let res: Response;
    try {
      res = await this.config.fetch(url, init);
    } catch (err) {
      throw connectionError(err, signal, `${spec.method} ${spec.path}`);
    }
    if (res.ok) {
      return res;
    }
    const text = await readLimited(res, maxErrorBody).catch(() => "");
    throw parseErrorBody(res.status, text, parseRetryAfter(res.headers.get("Retry-After")));
  }

  /**
   * backoff returns the wait before attempt i (i ≥ 1): "equal jitter"
   * exponential backoff, stretched to a Retry-After the daemon asked for;
   * undefined when that is longer than maxDelayMs.
   */
  private backoff(i: number, lastErr: unknown): number | undefined {
    const { baseDelayMs, maxDelayMs } = this.config.retry;
    let d = Math.min(baseDelayMs * 2 ** (i - 1), maxDelayMs);
    d = d / 2 + Math.random() * (d / 2);
    if (lastErr instanceof CubicleError && lastErr.retryAfterMs !== undefined) {
      if (lastErr.retryAfterMs > maxDelayMs) {
        return undefined;
      }
      d = Math.max(d, lastErr.retryAfterMs);
    }
    return Math.round(d);
  }

  private url(spec: RequestSpec): string {
    let u = this.config.baseUrl + spec.path;
    const q = spec.query?.toString();
    if (q) {
      u += "?" + q;
    }
    return u;
  }

  /** signalFor combines the caller's signal with the client's timeout. */
  private signalFor(spec: RequestSpec): AbortSignal | undefined {
    const signals: AbortSignal[] = [];
    if (spec.signal) {
      signals.push(spec.signal);
    }
    if (this.config.timeoutMs !== undefined && this.config.timeoutMs > 0 && !spec.streaming) {
      signals.push(AbortSignal.timeout(this.config.timeoutMs));
    }
    return anySignal(signals);
  }
}

/** retryable reports whether a failed attempt of an idempotent call is worth another. */
function retryable(err: unknown): boolean {
  if (err instanceof ConnectionError) {
    return true;
  }
  return err instanceof CubicleError && retryStatuses.has(err.status);
}

/**
 * connectionError turns a failure of fetch or of reading its body into a
 * ConnectionError, except for an abort, which stays the signal's reason,
 * and errors that are already the SDK's own.
 */
export function connectionError(err: unknown, signal: AbortSignal | undefined, what: string): unknown {
  if (signal?.aborted) {
    return signal.reason;
  }
  if (err instanceof CubicleError || err instanceof ConnectionError) {
    return err;
  }
  if (err instanceof Error && (err.name === "AbortError" || err.name === "TimeoutError" || err instanceof SyntaxError)) {
    // An abort is the caller's; a SyntaxError is an answer that is not
    // the JSON it should be, which another attempt would not change.
    return err;
  }
  const detail = err instanceof Error ? describe(err) : String(err);
  return new ConnectionError(`${what}: ${detail}`, { cause: err });
}

/** describe names an error and, as Node's fetch hides the reason in it, its cause. */
function describe(err: Error): string {
  const cause = (err as { cause?: unknown }).cause;
  if (cause instanceof Error && cause.message && cause.message !== err.message) {
    return `${err.message}: ${cause.message}`;
  }
  return err.message;
}

/** parseRetryAfter reads a Retry-After header (seconds or an HTTP date) as milliseconds. */
export function parseRetryAfter(h: string | null): number | undefined {
  if (h === null || h.trim() === "") {
    return undefined;
  }
  if (/^\d+$/.test(h.trim())) {
    return Number(h.trim()) * 1000;
  }
  const t = Date.parse(h);
  if (Number.isNaN(t)) {
    return undefined;
  }
  return Math.max(0, t - Date.now());
}

/** readLimited reads at most limit bytes of a body as text, then lets the rest go. */
async function readLimited(res: Response, limit: number): Promise<string> {
  if (!res.body) {
    return "";
  }
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let n = 0;
  try {
    while (n < limit) {
      const { value, done } = await reader.read();
      if (done) {
        break;
      }
      chunks.push(value);
      n += value.byteLength;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  return new TextDecoder().decode(concat(chunks).subarray(0, limit));
}

/** concat joins byte chunks. */
export function concat(chunks: Uint8Array[]): Uint8Array {
  if (chunks.length === 1 && chunks[0]) {
    return chunks[0];
  }
  let n = 0;
  for (const c of chunks) {
    n += c.byteLength;
  }
  const out = new Uint8Array(n);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.byteLength;
  }
  return out;
}

/** sleep waits ms, or rejects with the signal's reason once it aborts. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** anySignal aborts when any of signals does (AbortSignal.any, which Node has from 20.3). */
function anySignal(signals: AbortSignal[]): AbortSignal | undefined {
  if (signals.length <= 1) {
    return signals[0];
  }
  const any = (AbortSignal as { any?: (s: AbortSignal[]) => AbortSignal }).any;
  if (any) {
    return any(signals);
  }
  const ctl = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      ctl.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => ctl.abort(s.reason), { once: true });
  }
  return ctl.signal;
}
