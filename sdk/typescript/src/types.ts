/**
 * Wire types of cubicle's native REST API (API.md). Field names are the
 * API's own (snake_case), so a request or answer here reads exactly as in
 * the API's documentation and its OpenAPI document (GET /v1/openapi.json).
 */

/** A sandbox's place in its life. */
export type SandboxState =
  | "starting"
  | "running"
  | "pausing"
  | "paused"
  | "resuming"
  | "stopping"
  | "stopped"
  | "failed";

/** A sandbox backend: firecracker, qemu, gvisor or runc (or "auto"). */
export type BackendName = "firecracker" | "qemu" | "gvisor" | "runc" | "auto" | (string & {});

/** A screen size in pixels. */
export interface Resolution {
  width: number;
  height: number;
}

/**
 * A sandbox's egress policy: {"egress": "none"}, {"egress": "all"} or
 * {"egress": {"allow": ["CIDR", ...]}}.
 */
export interface Network {
  egress: "none" | "all" | { allow: string[] };
}

/** Attaches the volume name at path (absolute) in a sandbox. */
export interface VolumeMount {
  name: string;
  path: string;
}

/** The body of POST /v1/sandboxes. Every field is optional; left out, the daemon's default applies. */
export interface CreateSandboxRequest {
  /** The image to boot; the daemon's default is "desktop". */
  template?: string;
  backend?: BackendName;
  resolution?: Resolution;
  dpi?: number;
  vcpus?: number;
  memory_mb?: number;
  /** Maximum lifetime from now; 0 = the daemon's maximum. */
  timeout_seconds?: number;
  /** The sandbox is reaped after this long without API use. */
  idle_timeout_seconds?: number;
  /** Opens Chromium there once the desktop is up (http, https, about or file URL). */
  start_url?: string;
  env?: Record<string, string>;
  metadata?: Record<string, string>;
  network?: Network;
  /** Volumes attached read-write for the sandbox's life; each must be this key's and free. */
  volumes?: VolumeMount[];
  /** The lifetime and idle timeouts pause the sandbox instead of destroying it. */
  auto_pause?: boolean;
  /** Starts the sandbox from one of this key's snapshots (ID or name) instead of booting it. */
  from_snapshot?: string;
}

/** The daemon's view of one sandbox. */
export interface Sandbox {
  id: string;
  state: SandboxState;
  template: string;
  backend: string;
  /** vm, gvisor or namespace. */
  isolation: "vm" | "gvisor" | "namespace" | (string & {});
  resolution: Resolution;
  /** RFC 3339 times. */
  created_at: string;
  expires_at: string;
  last_active_at: string;
  metadata: Record<string, string>;
  ip?: string;
  volumes?: VolumeMount[];
  /** False for a headless sandbox (no X server); absent until it has started. */
  desktop?: boolean;
  /** Why the sandbox failed; only in state "failed". */
  error?: string;
  paused_at?: string;
  paused_bytes?: number;
  auto_pause?: boolean;
  from_snapshot?: string;
  [field: string]: unknown;
}

/** A mouse button. */
export type MouseButton = "left" | "right" | "middle";

/** Screenshot options, of GET …/screenshot and of the "screenshot" action. */
export interface ScreenshotOptions {
  /** png (default) or jpeg. */
  format?: "png" | "jpeg";
  /** JPEG quality, 1..100. */
  quality?: number;
  /** Downscale by this factor, 0.1..1; or give width. */
  scale?: number;
  /** Downscale to this width, keeping the aspect ratio. */
  width?: number;
  /** A region: x, y, w and h together. */
  x?: number;
  y?: number;
  w?: number;
  h?: number;
  /** Draw the pointer. */
  cursor?: boolean;
}

/** A key combination: "ctrl+shift+t" or ["ctrl", "shift", "t"] (xdotool keysym names and common aliases). */
export type Keys = string | string[];

/**
 * One action of POST /v1/sandboxes/{id}/actions (API.md's table).
 * Coordinates are screen pixels, origin top-left.
 */
export type Action =
  | { type: "move"; x: number; y: number }
  | { type: "click"; x?: number; y?: number; button?: MouseButton; count?: 1 | 2 | 3 }
  | { type: "double_click" | "triple_click"; x?: number; y?: number; button?: MouseButton }
  | { type: "mouse_down" | "mouse_up"; x?: number; y?: number; button?: MouseButton }
  | { type: "drag"; path: [number, number][]; button?: MouseButton }
  | { type: "scroll"; x?: number; y?: number; direction: "up" | "down" | "left" | "right"; amount?: number }
  | { type: "type"; text: string; delay_ms?: number }
  | { type: "key" | "key_down" | "key_up"; keys: Keys }
  | { type: "hold_key"; keys: Keys; duration_ms: number }
  | { type: "wait"; duration_ms: number }
  | { type: "cursor_position" }
  | { type: "screen_size" }
  | ({ type: "screenshot" } & ScreenshotOptions)
  | { type: "windows" }
  | { type: "clipboard_get" }
  | { type: "clipboard_set"; text: string };

/** The type of an action. */
export type ActionType = Action["type"];

/** One top-level window of the desktop. */
export interface Window {
  id: string | number;
  title: string;
  class: string;
  x: number;
  y: number;
  width: number;
  height: number;
  focused: boolean;
}

/**
 * The result of one action: {type} plus the fields its type reports: x, y
 * (cursor_position); width, height (screen_size, screenshot); format and
 * data, the image in base64 (screenshot); windows (windows).
 */
export interface ActionResult {
  type: ActionType | (string & {});
  x?: number;
  y?: number;
  width?: number;
  height?: number;
  format?: string;
  data?: string;
  windows?: Window[];
  /** The clipboard's text (clipboard_get). */
  text?: string;
  [field: string]: unknown;
}

/** The answer of an actions call: one result per action, in order. */
export interface ActionsResponse {
  results: ActionResult[];
  duration_ms: number;
}

/** A screenshot as JSON (Accept: application/json). */
export interface ScreenshotJSON {
  format: string;
  width: number;
  height: number;
  /** The image, base64. */
  data: string;
}

/** A command to run: exactly one of command (run by /bin/sh -c) and argv. */
export interface ExecRequest {
  command?: string;
  argv?: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** Kills the command after this long (0: the daemon's default). */
  timeout_seconds?: number;
  stdin?: string;
}

/** The outcome of a finished command. A non-zero exit code is not an error. */
export interface ExecResult {
  exit_code: number;
  stdout: string;
  stderr: string;
  duration_ms: number;
  /** The output exceeded the daemon's cap and was cut short. */
  truncated?: boolean;
  /** timeout_seconds killed the command (exit_code is then -1). */
  timed_out?: boolean;
}

/** One event of a streamed command: a chunk of output, the truncation notice, or (last) its exit. */
export type ExecEvent =
  | { type: "stdout"; data: string }
  | { type: "stderr"; data: string }
  | { type: "truncated" }
  | { type: "exit"; exit_code: number; duration_ms?: number; timed_out?: boolean };

/** The answer to a file upload. */
export interface FileInfo {
  path: string;
  size: number;
}

/** One entry of a directory listing. */
export interface FileEntry {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink" | (string & {});
  size: number;
  mode: number;
  modified_at?: string;
  symlink_target?: string;
}

/** The body of POST …/view. */
export interface ViewRequest {
  /** How long the link works (0 or absent: the daemon's default, 10 min). */
  ttl_seconds?: number;
  /** The viewer may watch but not control the desktop (the daemon's default is true). */
  view_only?: boolean;
}

/** A live-view link: a noVNC page that needs no API key until it expires. */
export interface View {
  url: string;
  expires_at: string;
  view_only: boolean;
}

/** A persistent disk of an API key, outliving the sandboxes it is attached to. */
export interface Volume {
  name: string;
  size_mb: number;
  created_at: string;
  /** The sandbox holding the volume now; absent when free. */
  attached_to?: string;
  /** Host disk the (sparse) volume takes now. */
  used_mb: number;
}

/** A running sandbox saved as it was, to start new sandboxes from. */
export interface Snapshot {
  id: string;
  name?: string;
  sandbox_id: string;
  template: string;
  backend: string;
  resolution: Resolution;
  vcpus?: number;
  memory_mb?: number;
  size_bytes: number;
  created_at: string;
  metadata: Record<string, string>;
}

/** The optional parts of a snapshot. */
export interface CreateSnapshotRequest {
  /** Unique among this key's snapshots. */
  name?: string;
  metadata?: Record<string, string>;
}

/** A backend's optional features on this host. */
export interface Capabilities {
  volumes: boolean;
  pause: boolean;
  pause_reason?: string;
  snapshot: boolean;
  snapshot_reason?: string;
  [field: string]: unknown;
}

/** The program a backend runs its sandboxes with (runsc, runc). */
export interface Runtime {
  name: string;
  path: string;
  /** What the program says of itself; absent when it did not run. */
  version?: string;
}

/** One sandbox backend of the daemon. */
export interface Backend {
  name: string;
  available: boolean;
  isolation: string;
  reason?: string;
  capabilities?: Capabilities;
  runtime?: Runtime;
}

/** One warm pool of the daemon. */
export interface Pool {
  pool: string;
  backend: string;
  template: string;
  width: number;
  height: number;
  size: number;
  ready: number;
}

/** GET /v1/info. */
export interface Info {
  version: string;
  backends: Backend[];
  default_backend: string;
  capacity: { max_sandboxes: number; running: number };
  pools?: Pool[];
  [field: string]: unknown;
}

/** GET /healthz. */
export interface Health {
  status: string;
}

/** One sample of a sandbox's resource figures, as the host measures them. */
export interface MetricsSample {
  /** RFC 3339. */
  timestamp: string;
  cpu: {
    /** CPU time used since the box started. */
    used_seconds: number;
    /** Share of the sandbox's CPUs used since the previous sample, 0-100. */
    percent: number;
    /** CPUs' worth the sandbox may use. */
    count: number;
  };
  /** Bytes; limit_bytes 0: none known. */
  memory: { used_bytes: number; cache_bytes: number; limit_bytes: number };
  /** The sandbox's own writable disk, in bytes; limit_bytes 0: unbounded. */
  disk: { used_bytes: number; limit_bytes: number };
  /** Absent for a sandbox without a network; rx is what the sandbox received. */
  network?: { rx_bytes: number; tx_bytes: number; rx_packets: number; tx_packets: number };
}

/** GET /v1/sandboxes/{id}/metrics. */
export interface Metrics {
  sandbox_id: string;
  backend: string;
  state: SandboxState;
  /** Seconds between samples. */
  interval_seconds: number;
  /** Seconds of history kept. */
  window_seconds: number;
  /** The newest sample; null until the first, one interval after the sandbox starts running. */
  latest: MetricsSample | null;
  /** The kept samples (after since), oldest first. */
  samples: MetricsSample[];
}

/** Options of metrics. */
export interface MetricsOptions {
  /** Only samples taken after this time (a Date or an RFC 3339 string). */
  since?: Date | string;
}

/** A log level, least severe first. */
export type LogLevel = "debug" | "info" | "warn" | "error";

/** One line a sandbox printed on its console (GET /v1/sandboxes/{id}/logs). */
export interface LogEntry {
  /**
   * When it was printed (the agent's time) or read by the daemon: RFC 3339
   * with nanoseconds, unique per sandbox and in printing order. Pass it as
   * since to get only the lines after this one.
   */
  timestamp: string;
  level: LogLevel;
  /** agent (the sandbox agent's own log), console (anything else the sandbox printed) or cubicled (the daemon's notes). */
  source: "agent" | "console" | "cubicled" | (string & {});
  message: string;
  /** The key=value pairs of an agent line. */
  fields?: Record<string, string>;
}

/** Options of logs. */
export interface LogsOptions {
  /** Only lines after this time (a LogEntry's timestamp, an RFC 3339 string or a Date), oldest first; without it, the newest lines. */
  since?: Date | string;
  /** The most lines returned, 1..1000 (default 1000). */
  limit?: number;
  /** The least severe level returned. */
  level?: LogLevel;
  /** Only lines whose message contains this (case-sensitive). */
  search?: string;
}
