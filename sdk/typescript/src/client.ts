/**
 * The Cubicle client: one method per endpoint of cubicle's native REST
 * API, plus shorthands for single desktop actions.
 */

import type {
  AnthropicComputerBatchRequest,
  AnthropicComputerBatchResponse,
  AnthropicComputerInputRequest,
  AnthropicToolResult,
  OpenAIComputerCallOutput,
  OpenAIComputerRequest,
} from "./computer.js";
import { ExecStream } from "./exec-stream.js";
import { Transport, type FetchLike, type RequestSpec, type RetryOptions } from "./transport.js";
import type {
  Action,
  ActionResult,
  ActionsResponse,
  CreateSandboxRequest,
  CreateSnapshotRequest,
  ExecRequest,
  ExecResult,
  FileEntry,
  FileInfo,
  Health,
  Info,
  Keys,
  LogEntry,
  LogsOptions,
  Metrics,
  MetricsOptions,
  MouseButton,
  Resolution,
  Sandbox,
  SandboxState,
  ScreenshotOptions,
  Snapshot,
  View,
  ViewRequest,
  Volume,
  Window,
} from "./types.js";

/** The SDK's version, sent in its User-Agent. */
export const VERSION = "0.1.0";

/** The daemon's default address. */
export const DEFAULT_BASE_URL = "http://127.0.0.1:7171";

/** Options of the Cubicle constructor. */
export interface CubicleOptions {
  /** The daemon, e.g. "http://127.0.0.1:7171" (a path prefix is kept). Default: env CUBICLE_URL, else http://127.0.0.1:7171. */
  baseUrl?: string;
  /** The API key, sent as X-API-Key. Default: env CUBICLE_API_KEY; "" sends none. */
  apiKey?: string;
  /**
   * Bounds every call, retries and reading the answer included, in
   * milliseconds (default: no bound beyond the caller's signal). It does
   * not apply to execStream, which lasts as long as its command. Note that
   * create waits for the desktop to boot unless wait is false.
   */
  timeoutMs?: number;
  /** How idempotent calls (GET, PUT of a file, DELETE) are retried. */
  retry?: RetryOptions;
  /** The fetch to use (default: the global fetch). */
  fetch?: FetchLike;
  /** Extra headers for every request. */
  headers?: Record<string, string>;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the call (and its retries); the call then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of create. */
export interface CreateOptions extends CallOptions {
  /**
   * false returns at once with the sandbox "starting" (?wait=false); poll
   * get until it is "running" or "failed". Default true: create returns
   * once the desktop is usable (its session complete, Chromium focused).
   */
  wait?: boolean;
}

/** Filters of list; absent fields match every sandbox. */
export interface ListOptions extends CallOptions {
  state?: SandboxState;
  /** Only sandboxes whose metadata has all these pairs. */
  metadata?: Record<string, string>;
}

/** The body of a file upload. A ReadableStream is sent once, never retried. */
export type FileData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

/** env reads an environment variable where there is a process (Node); undefined elsewhere. */
function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = proc?.env?.[name];
  return v === "" ? undefined : v;
}

/** must rejects an empty id or name, which would address another endpoint. */
function must(what: string, v: string): string {
  if (typeof v !== "string" || v === "") {
    throw new TypeError(`cubicle: empty ${what}`);
  }
  return encodeURIComponent(v);
}

function sandboxPath(id: string, sub?: string): string {
  return `/v1/sandboxes/${must("sandbox id", id)}` + (sub ? `/${sub}` : "");
}

/** timeParam is a time for a query: strings as they are (a LogEntry's timestamp keeps its nanoseconds), Dates in RFC 3339. */
function timeParam(t: Date | string): string {
  return typeof t === "string" ? t : t.toISOString();
}

/** readJSON reads a JSON answer; an empty one (204) as undefined. */
async function readJSON<T>(res: Response): Promise<T> {
  const text = await res.text();
  if (res.status === 204 || text.trim() === "") {
    return undefined as T;
  }
  return JSON.parse(text) as T;
}

async function readBytes(res: Response): Promise<Uint8Array> {
  return new Uint8Array(await res.arrayBuffer());
}

async function discard(res: Response): Promise<void> {
  await res.arrayBuffer();
}

function screenshotQuery(opts: ScreenshotOptions): URLSearchParams {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(opts)) {
    if (v !== undefined && v !== null) {
      q.set(k, String(v));
    }
  }
  return q;
}

/**
 * Cubicle is a client of one cubicle daemon. All methods return promises;
 * error answers reject with a CubicleError subclass (NotFoundError, …).
 * Idempotent calls are retried on network errors, 502/503/504 and 429
 * (honouring Retry-After) with bounded exponential backoff; POSTs (create,
 * exec, actions, …) never are.
 *
 * ```ts
 * const cubicle = new Cubicle(); // CUBICLE_URL, CUBICLE_API_KEY
 * const sb = await cubicle.create({ resolution: { width: 1024, height: 768 } });
 * await cubicle.click(sb.id, 100, 200);
 * const png = await cubicle.screenshot(sb.id);
 * await cubicle.destroy(sb.id);
 * ```
 */
export class Cubicle {
  /** The daemon's address, without a trailing slash. */
  readonly baseUrl: string;
  readonly #t: Transport;

  constructor(options: CubicleOptions = {}) {
    const base = (options.baseUrl ?? env("CUBICLE_URL") ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
    let u: URL;
    try {
      u = new URL(base);
    } catch {
      throw new TypeError(`cubicle: bad base URL ${JSON.stringify(base)}: want scheme://host[:port]`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new TypeError(`cubicle: bad base URL ${JSON.stringify(base)}: want http or https`);
    }
    const f = options.fetch ?? (globalThis.fetch as FetchLike | undefined);
    if (!f) {
      throw new TypeError("cubicle: no global fetch (Node >= 20 has one); pass options.fetch");
    }
    this.baseUrl = base;
    this.#t = new Transport({
      baseUrl: base,
      // An explicit "" sends no key, whatever the environment says.
      apiKey: options.apiKey !== undefined ? options.apiKey : env("CUBICLE_API_KEY"),
      timeoutMs: options.timeoutMs,
      retry: {
        maxRetries: Math.max(0, options.retry?.maxRetries ?? 3),
        baseDelayMs: Math.max(0, options.retry?.baseDelayMs ?? 200),
        maxDelayMs: Math.max(0, options.retry?.maxDelayMs ?? 10_000),
      },
      fetch: f,
      headers: { "User-Agent": `cubicle-typescript-sdk/${VERSION}`, ...options.headers },
    });
  }

  #json<T>(spec: RequestSpec): Promise<T> {
    return this.#t.call(spec, readJSON<T>);
  }

  // Service.

  /** health returns the daemon's GET /healthz answer ({status: "ok"}); it needs no API key. */
  health(opts: CallOptions = {}): Promise<Health> {
    return this.#json({ method: "GET", path: "/healthz", idempotent: true, signal: opts.signal });
  }

  /** info returns the daemon's version, backends (with capabilities), capacity and warm pools. */
  info(opts: CallOptions = {}): Promise<Info> {
    return this.#json({ method: "GET", path: "/v1/info", idempotent: true, signal: opts.signal });
  }

  /** openapi returns the daemon's OpenAPI 3 document. */
  openapi(opts: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.#json({ method: "GET", path: "/v1/openapi.json", idempotent: true, signal: opts.signal });
  }

  // Lifecycle.

  /**
   * create starts a sandbox. By default it returns once its desktop is
   * usable (keys typed at once reach Chromium); on failure the daemon
   * leaves nothing behind.
   * It is never retried.
   */
  create(req: CreateSandboxRequest = {}, opts: CreateOptions = {}): Promise<Sandbox> {
    const query = opts.wait === false ? new URLSearchParams({ wait: "false" }) : undefined;
    return this.#json({ method: "POST", path: "/v1/sandboxes", query, json: req, idempotent: false, signal: opts.signal });
  }

  /** list returns the sandboxes matching the filters (stopped ones stay listed for a while). */
  async list(opts: ListOptions = {}): Promise<Sandbox[]> {
    const query = new URLSearchParams();
    if (opts.state) {
      query.set("state", opts.state);
    }
    for (const [k, v] of Object.entries(opts.metadata ?? {})) {
      query.set(`metadata.${k}`, v);
    }
    const out = await this.#json<{ sandboxes?: Sandbox[] }>({ method: "GET", path: "/v1/sandboxes", query, idempotent: true, signal: opts.signal });
    return out?.sandboxes ?? [];
  }

  /** get returns one sandbox; an unknown id rejects with NotFoundError. */
  get(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#json({ method: "GET", path: sandboxPath(id), idempotent: true, signal: opts.signal });
  }

  /**
   * destroy stops the sandbox and frees everything it holds, resolving once
   * that is done. An unknown id rejects with NotFoundError; a sandbox
   * already stopped (still listed) resolves, so a retried destroy is safe.
   */
  async destroy(id: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.call({ method: "DELETE", path: sandboxPath(id), idempotent: true, signal: opts.signal }, discard);
  }

  /** setTimeout sets the sandbox's expiry to seconds from now (0: the daemon's maximum) and returns it. */
  setTimeout(id: string, seconds: number, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#json({ method: "POST", path: sandboxPath(id, "timeout"), json: { timeout_seconds: seconds }, idempotent: false, signal: opts.signal });
  }

  /**
   * pause saves a running sandbox to disk and returns it "paused". A
   * backend that cannot pause rejects with NotSupportedError; a sandbox not
   * running with ConflictError.
   */
  pause(id: string, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#json({ method: "POST", path: sandboxPath(id, "pause"), idempotent: false, signal: opts.signal });
  }

  /**
   * resume brings a paused sandbox back as it was and returns it running,
   * expiring timeout_seconds from now (absent or 0: with the running time it
   * had left).
   */
  resume(id: string, req: { timeout_seconds?: number } = {}, opts: CallOptions = {}): Promise<Sandbox> {
    return this.#json({ method: "POST", path: sandboxPath(id, "resume"), json: req, idempotent: false, signal: opts.signal });
  }

  /**
   * metrics returns the sandbox's resource figures as the host measures
   * them: the latest sample and the history kept (after since, when
   * given). Reading them is not activity for the idle timeout; a sandbox
   * stopping or gone rejects with ConflictError.
   */
  metrics(id: string, opts: MetricsOptions & CallOptions = {}): Promise<Metrics> {
    const query = new URLSearchParams();
    if (opts.since !== undefined) {
      query.set("since", timeParam(opts.since));
    }
    return this.#json({ method: "GET", path: sandboxPath(id, "metrics"), query, idempotent: true, signal: opts.signal });
  }

  /**
   * logs returns what the sandbox printed on its console, oldest first:
   * the agent's log of the session's programs, what they print and, in a
   * VM, the kernel. Without since, the newest limit lines; with since (a
   * LogEntry's timestamp), only those after it. Only the API key that
   * created the sandbox reads its logs (NotFoundError for any other); a
   * stopped sandbox's are kept while it is listed.
   */
  async logs(id: string, opts: LogsOptions & CallOptions = {}): Promise<LogEntry[]> {
    const query = new URLSearchParams();
    if (opts.since !== undefined) {
      query.set("since", timeParam(opts.since));
    }
    if (opts.limit !== undefined) {
      query.set("limit", String(opts.limit));
    }
    if (opts.level !== undefined) {
      query.set("level", opts.level);
    }
    if (opts.search !== undefined) {
      query.set("search", opts.search);
    }
    const out = await this.#json<{ logs?: LogEntry[] }>({ method: "GET", path: sandboxPath(id, "logs"), query, idempotent: true, signal: opts.signal });
    return out?.logs ?? [];
  }

  /**
   * fork copies a running sandbox, as it is, into count (1..10) new running
   * sandboxes; the sandbox runs on. A backend that cannot fork rejects with
   * NotSupportedError.
   */
  async fork(id: string, count = 1, opts: CallOptions = {}): Promise<Sandbox[]> {
    const out = await this.#json<{ sandboxes?: Sandbox[] }>({ method: "POST", path: sandboxPath(id, "fork"), json: { count }, idempotent: false, signal: opts.signal });
    return out?.sandboxes ?? [];
  }

  // Snapshots.

  /** createSnapshot saves the running sandbox as a snapshot of this key; the sandbox runs on. */
  createSnapshot(id: string, req: CreateSnapshotRequest = {}, opts: CallOptions = {}): Promise<Snapshot> {
    return this.#json({ method: "POST", path: sandboxPath(id, "snapshots"), json: req, idempotent: false, signal: opts.signal });
  }

  /** listSnapshots returns this key's snapshots, oldest first; with sandbox_id only those taken of it. */
  async listSnapshots(filter: { sandbox_id?: string } = {}, opts: CallOptions = {}): Promise<Snapshot[]> {
    const query = filter.sandbox_id ? new URLSearchParams({ sandbox_id: filter.sandbox_id }) : undefined;
    const out = await this.#json<{ snapshots?: Snapshot[] }>({ method: "GET", path: "/v1/snapshots", query, idempotent: true, signal: opts.signal });
    return out?.snapshots ?? [];
  }

  /** getSnapshot returns one snapshot by ID or name. */
  getSnapshot(ref: string, opts: CallOptions = {}): Promise<Snapshot> {
    return this.#json({ method: "GET", path: `/v1/snapshots/${must("snapshot", ref)}`, idempotent: true, signal: opts.signal });
  }

  /** deleteSnapshot removes a snapshot by ID or name; sandboxes started from it run on. */
  async deleteSnapshot(ref: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.call({ method: "DELETE", path: `/v1/snapshots/${must("snapshot", ref)}`, idempotent: true, signal: opts.signal }, discard);
  }

  // Volumes.

  /** createVolume makes an empty volume of size_mb (sparse on the host). A name in use rejects with ConflictError. */
  createVolume(name: string, sizeMb: number, opts: CallOptions = {}): Promise<Volume> {
    return this.#json({ method: "POST", path: "/v1/volumes", json: { name, size_mb: sizeMb }, idempotent: false, signal: opts.signal });
  }

  /** listVolumes returns this key's volumes. */
  async listVolumes(opts: CallOptions = {}): Promise<Volume[]> {
    const out = await this.#json<{ volumes?: Volume[] }>({ method: "GET", path: "/v1/volumes", idempotent: true, signal: opts.signal });
    return out?.volumes ?? [];
  }

  /** getVolume returns one volume. */
  getVolume(name: string, opts: CallOptions = {}): Promise<Volume> {
    return this.#json({ method: "GET", path: `/v1/volumes/${must("volume name", name)}`, idempotent: true, signal: opts.signal });
  }

  /** deleteVolume removes a volume and its data; one a sandbox holds rejects with ConflictError. */
  async deleteVolume(name: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.call({ method: "DELETE", path: `/v1/volumes/${must("volume name", name)}`, idempotent: true, signal: opts.signal }, discard);
  }

  // Desktop.

  /** screenshot returns the sandbox's screen as image bytes (PNG unless format is "jpeg"). */
  screenshot(id: string, opts: ScreenshotOptions & CallOptions = {}): Promise<Uint8Array> {
    const { signal, ...shot } = opts;
    return this.#t.call(
      { method: "GET", path: sandboxPath(id, "screenshot"), query: screenshotQuery(shot), accept: "image/*", idempotent: true, signal },
      readBytes,
    );
  }

  /**
   * actions runs one action, or a list in order, in one round trip. The
   * first failing action stops a list: the call rejects with a
   * CubicleError (InvalidArgumentError for a bad action) whose index says
   * which; the ones before it ran (their results are in error.body). Never
   * retried.
   */
  async actions(id: string, actions: Action | Action[], opts: CallOptions = {}): Promise<ActionsResponse> {
    const json = Array.isArray(actions) ? { actions } : actions;
    const out = await this.#json<ActionsResponse>({ method: "POST", path: sandboxPath(id, "actions"), json, idempotent: false, signal: opts.signal });
    return { results: out?.results ?? [], duration_ms: out?.duration_ms ?? 0 };
  }

  /** action runs a single action and returns its result. */
  async action(id: string, action: Action, opts: CallOptions = {}): Promise<ActionResult> {
    const out = await this.actions(id, action, opts);
    return out.results[0] ?? { type: action.type };
  }

  /** move moves the pointer to (x, y). */
  async move(id: string, x: number, y: number, opts: CallOptions = {}): Promise<void> {
    await this.action(id, { type: "move", x, y }, opts);
  }

  /** click clicks at (x, y) (where the pointer is, if x and y are undefined); left button once by default. */
  async click(id: string, x?: number, y?: number, opts: CallOptions & { button?: MouseButton; count?: 1 | 2 | 3 } = {}): Promise<void> {
    const { signal, button, count } = opts;
    await this.action(id, { type: "click", x, y, button, count }, { signal });
  }

  /** doubleClick double-clicks with the left button at (x, y). */
  async doubleClick(id: string, x?: number, y?: number, opts: CallOptions = {}): Promise<void> {
    await this.action(id, { type: "double_click", x, y }, opts);
  }

  /** drag drags with the left button along path (at least two [x, y] points). */
  async drag(id: string, path: [number, number][], opts: CallOptions = {}): Promise<void> {
    await this.action(id, { type: "drag", path }, opts);
  }

  /** scroll scrolls amount steps in direction, where the pointer is or at (x, y). */
  async scroll(
    id: string,
    direction: "up" | "down" | "left" | "right",
    amount = 1,
    opts: CallOptions & { x?: number; y?: number } = {},
  ): Promise<void> {
    const { signal, x, y } = opts;
    await this.action(id, { type: "scroll", direction, amount, x, y }, { signal });
  }

  /** type types text (any Unicode) into the focused window. */
  async type(id: string, text: string, opts: CallOptions & { delay_ms?: number } = {}): Promise<void> {
    const { signal, delay_ms } = opts;
    await this.action(id, { type: "type", text, delay_ms }, { signal });
  }

  /** key presses and releases a combination such as "ctrl+shift+t" or ["ctrl", "l"]. */
  async key(id: string, keys: Keys, opts: CallOptions = {}): Promise<void> {
    await this.action(id, { type: "key", keys }, opts);
  }

  /** cursorPosition returns where the pointer is. */
  async cursorPosition(id: string, opts: CallOptions = {}): Promise<{ x: number; y: number }> {
    const r = await this.action(id, { type: "cursor_position" }, opts);
    return { x: r.x ?? 0, y: r.y ?? 0 };
  }

  /** screenSize returns the size of the sandbox's screen. */
  async screenSize(id: string, opts: CallOptions = {}): Promise<Resolution> {
    const r = await this.action(id, { type: "screen_size" }, opts);
    return { width: r.width ?? 0, height: r.height ?? 0 };
  }

  /** windows lists the desktop's top-level windows. */
  async windows(id: string, opts: CallOptions = {}): Promise<Window[]> {
    const r = await this.action(id, { type: "windows" }, opts);
    return r.windows ?? [];
  }

  /** clipboardGet returns the text on the desktop's clipboard (what ctrl+c copied). */
  async clipboardGet(id: string, opts: CallOptions = {}): Promise<string> {
    const r = await this.action(id, { type: "clipboard_get" }, opts);
    return typeof r.text === "string" ? r.text : "";
  }

  /** clipboardSet puts text (any Unicode, at most 64 KiB) on the desktop's clipboard, where it stays until an application copies something else. */
  async clipboardSet(id: string, text: string, opts: CallOptions = {}): Promise<void> {
    await this.action(id, { type: "clipboard_set", text }, opts);
  }

  // Shell.

  /** exec runs a command to completion and returns its output and exit code. Never retried. */
  exec(id: string, req: ExecRequest, opts: CallOptions = {}): Promise<ExecResult> {
    return this.#json({ method: "POST", path: sandboxPath(id, "exec"), json: { ...req, background: false }, idempotent: false, signal: opts.signal });
  }

  /** execBackground starts a command that keeps running after the call and returns its pid. */
  async execBackground(id: string, req: ExecRequest, opts: CallOptions = {}): Promise<number> {
    const out = await this.#json<{ pid: number }>({ method: "POST", path: sandboxPath(id, "exec"), json: { ...req, background: true }, idempotent: false, signal: opts.signal });
    return out.pid;
  }

  /**
   * execStream runs a command whose output streams as it arrives. It
   * resolves once the daemon has accepted the command (rejecting like exec
   * otherwise) with an ExecStream to iterate for its events or wait() on.
   * The client's timeoutMs does not apply; bound it with opts.signal or
   * req.timeout_seconds. Never retried.
   */
  execStream(id: string, req: ExecRequest, opts: CallOptions = {}): Promise<ExecStream> {
    return this.#t.call(
      {
        method: "POST",
        path: sandboxPath(id, "exec"),
        json: { ...req, background: false },
        accept: "application/x-ndjson",
        idempotent: false,
        streaming: true,
        signal: opts.signal,
      },
      async (res) => {
        if (!res.body) {
          throw new TypeError("exec stream: the answer has no body");
        }
        return new ExecStream(res.body, opts.signal);
      },
    );
  }

  // Files.

  /** writeFile writes data to path (absolute, in the sandbox), creating parent directories. */
  writeFile(id: string, path: string, data: FileData, opts: CallOptions = {}): Promise<FileInfo> {
    return this.#json({
      method: "PUT",
      path: sandboxPath(id, "files"),
      query: new URLSearchParams({ path }),
      body: typeof data === "string" ? new TextEncoder().encode(data) : data,
      contentType: "application/octet-stream",
      idempotent: true,
      signal: opts.signal,
    });
  }

  /** readFile returns the bytes of path; a missing file rejects with NotFoundError. */
  readFile(id: string, path: string, opts: CallOptions = {}): Promise<Uint8Array> {
    return this.#t.call(
      { method: "GET", path: sandboxPath(id, "files"), query: new URLSearchParams({ path }), accept: "application/octet-stream", idempotent: true, signal: opts.signal },
      readBytes,
    );
  }

  /** readFileText returns path decoded as UTF-8. */
  async readFileText(id: string, path: string, opts: CallOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.readFile(id, path, opts));
  }

  /** listFiles lists the directory path. */
  async listFiles(id: string, path: string, opts: CallOptions = {}): Promise<FileEntry[]> {
    const out = await this.#json<{ entries?: FileEntry[] }>({
      method: "GET",
      path: sandboxPath(id, "files/list"),
      query: new URLSearchParams({ path }),
      idempotent: true,
      signal: opts.signal,
    });
    return out?.entries ?? [];
  }

  /** deleteFile removes path. */
  async deleteFile(id: string, path: string, opts: CallOptions = {}): Promise<void> {
    await this.#t.call(
      { method: "DELETE", path: sandboxPath(id, "files"), query: new URLSearchParams({ path }), idempotent: true, signal: opts.signal },
      discard,
    );
  }

  // Live view.

  /**
   * view mints a link for watching (or, with view_only false, controlling)
   * the desktop in a browser without an API key, until it expires.
   */
  view(id: string, req: ViewRequest = {}, opts: CallOptions = {}): Promise<View> {
    return this.#json({ method: "POST", path: sandboxPath(id, "view"), json: req, idempotent: false, signal: opts.signal });
  }

  // Vendor computer-use endpoints.

  /**
   * computerAnthropic runs an Anthropic computer-use tool call on the
   * sandbox's desktop: {input} (one tool_use's input) answers one
   * tool_result; {tool_uses} (a turn's tool_use blocks) answers
   * {tool_results}. Never retried. A failing tool use rejects with a
   * CubicleError whose index says which, and whose body carries the
   * tool_result (or tool_results) to send back to the model.
   */
  computerAnthropic(id: string, body: AnthropicComputerInputRequest, opts?: CallOptions): Promise<AnthropicToolResult>;
  computerAnthropic(id: string, body: AnthropicComputerBatchRequest, opts?: CallOptions): Promise<AnthropicComputerBatchResponse>;
  computerAnthropic(
    id: string,
    body: AnthropicComputerInputRequest | AnthropicComputerBatchRequest,
    opts: CallOptions = {},
  ): Promise<AnthropicToolResult | AnthropicComputerBatchResponse> {
    return this.#json({ method: "POST", path: sandboxPath(id, "computer/anthropic"), json: body, idempotent: false, signal: opts.signal });
  }

  /**
   * computerOpenAI runs an OpenAI computer_call on the sandbox's desktop and
   * answers its computer_call_output (a screenshot after the action). Never
   * retried.
   */
  computerOpenAI(id: string, body: OpenAIComputerRequest, opts: CallOptions = {}): Promise<OpenAIComputerCallOutput> {
    return this.#json({ method: "POST", path: sandboxPath(id, "computer/openai"), json: body, idempotent: false, signal: opts.signal });
  }
}

/** decodeBase64 decodes the base64 data of a screenshot action result into bytes. */
export function decodeBase64(data: string): Uint8Array {
  const bin = atob(data);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) {
    out[i] = bin.charCodeAt(i);
  }
  return out;
}
