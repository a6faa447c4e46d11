/**
 * Errors of the cubicle SDK. Every error answer of the daemon, a non-2xx
 * status with the body {"error": {"code", "message"}}, becomes a
 * {@link CubicleError}: an instance of the subclass for its code where the
 * SDK knows it (NotFoundError for "not_found", …), of CubicleError itself
 * for a code it does not know yet. A request that got no answer at all
 * fails with a {@link ConnectionError}; one the caller aborted with the
 * abort reason (a DOMException named "AbortError" or "TimeoutError").
 */

/** The API error codes the daemon uses (internal/api/errors.go). */
export const ErrorCode = {
  Unauthorized: "unauthorized",
  PermissionDenied: "permission_denied",
  NotFound: "not_found",
  InvalidArgument: "invalid_argument",
  Conflict: "conflict",
  NoDesktop: "no_desktop",
  NotSupported: "not_supported",
  PayloadTooLarge: "payload_too_large",
  CapacityExhausted: "capacity_exhausted",
  RateLimited: "rate_limited",
  Timeout: "timeout",
  Unavailable: "unavailable",
  MethodNotAllowed: "method_not_allowed",
  Canceled: "canceled",
  InsufficientStorage: "insufficient_storage",
  Internal: "internal",
} as const;

/** One of the known API error codes, or a newer one as a plain string. */
export type ErrorCodeName = (typeof ErrorCode)[keyof typeof ErrorCode] | (string & {});

/** Extra details of a {@link CubicleError}. */
export interface CubicleErrorOptions {
  /** The parsed error body, e.g. with the "results" of the actions that ran before a failing one. */
  body?: unknown;
  /** What the daemon's Retry-After header asked for, in milliseconds. */
  retryAfterMs?: number;
  /** The underlying error, if any. */
  cause?: unknown;
}

/**
 * CubicleError is an error answer of the daemon: its HTTP status, its
 * snake_case API code and its human-readable message; for a failed actions
 * call also the index of the action that failed (the ones before it ran).
 *
 * status is 0 for an error reported inside a streamed exec, after the 200
 * was sent.
 */
export class CubicleError extends Error {
  override name = "CubicleError";
  readonly status: number;
  readonly code: ErrorCodeName;
  /** The position of the failing action of an actions call; undefined otherwise. */
  readonly index: number | undefined;
  /** The parsed error body, when there was one. */
  readonly body: unknown;
  /** The wait the daemon asked for with Retry-After, in milliseconds. */
  readonly retryAfterMs: number | undefined;

  constructor(status: number, code: ErrorCodeName, message: string, index?: number, options: CubicleErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.status = status;
    this.code = code;
    this.index = index;
    this.body = options.body;
    this.retryAfterMs = options.retryAfterMs;
  }
}

/** 401 unauthorized: the API key is missing or wrong. */
export class UnauthorizedError extends CubicleError {
  override name = "UnauthorizedError";
}
/** 403 permission_denied: the sandbox refused access to a path. */
export class PermissionDeniedError extends CubicleError {
  override name = "PermissionDeniedError";
}
/** 404 not_found: no such sandbox, file, volume or snapshot (for this key). */
export class NotFoundError extends CubicleError {
  override name = "NotFoundError";
}
/** 400 invalid_argument: the request is malformed or out of range. */
export class InvalidArgumentError extends CubicleError {
  override name = "InvalidArgumentError";
}
/** 409 conflict: the request does not fit the current state (e.g. the sandbox is not running). */
export class ConflictError extends CubicleError {
  override name = "ConflictError";
}
/** 409 no_desktop: a desktop call (screenshot, actions, live view) to a headless sandbox. */
export class NoDesktopError extends CubicleError {
  override name = "NoDesktopError";
}
/** 409 not_supported: the sandbox's backend or agent cannot do this (pause, fork, …). */
export class NotSupportedError extends CubicleError {
  override name = "NotSupportedError";
}
/** 413 payload_too_large: a body or upload over the daemon's limit. */
export class PayloadTooLargeError extends CubicleError {
  override name = "PayloadTooLargeError";
}
/** 429 or 503 capacity_exhausted: no room for another sandbox (daemon-wide or for this key). */
export class CapacityExhaustedError extends CubicleError {
  override name = "CapacityExhaustedError";
}
/** 429 rate_limited: too many requests; retryAfterMs says how long to wait. */
export class RateLimitedError extends CubicleError {
  override name = "RateLimitedError";
}
/** 504 timeout: the daemon or the sandbox gave up waiting. Not the caller's own abort. */
export class TimeoutError extends CubicleError {
  override name = "TimeoutError";
}
/** 503 unavailable: temporarily unavailable (the desktop is restarting, the disk is full); retry later. */
export class UnavailableError extends CubicleError {
  override name = "UnavailableError";
}
/** 500 internal: a fault of the daemon; its log has the details. */
export class InternalError extends CubicleError {
  override name = "InternalError";
}

type ErrorClass = new (
  status: number,
  code: ErrorCodeName,
  message: string,
  index?: number,
  options?: CubicleErrorOptions,
) => CubicleError;

const classes: Record<string, ErrorClass> = {
  [ErrorCode.Unauthorized]: UnauthorizedError,
  [ErrorCode.PermissionDenied]: PermissionDeniedError,
  [ErrorCode.NotFound]: NotFoundError,
  [ErrorCode.InvalidArgument]: InvalidArgumentError,
  [ErrorCode.Conflict]: ConflictError,
  [ErrorCode.NoDesktop]: NoDesktopError,
  [ErrorCode.NotSupported]: NotSupportedError,
  [ErrorCode.PayloadTooLarge]: PayloadTooLargeError,
  [ErrorCode.CapacityExhausted]: CapacityExhaustedError,
  [ErrorCode.RateLimited]: RateLimitedError,
  [ErrorCode.Timeout]: TimeoutError,
  [ErrorCode.Unavailable]: UnavailableError,
  [ErrorCode.Internal]: InternalError,
};

/**
 * codeForStatus is the code of an error answer that carries none (a proxy
 * answered, say), as the Go SDK derives it.
 */
export function codeForStatus(status: number): ErrorCodeName {
  switch (status) {
    case 401:
      return ErrorCode.Unauthorized;
    case 403:
      return ErrorCode.PermissionDenied;
    case 404:
      return ErrorCode.NotFound;
    case 400:
      return ErrorCode.InvalidArgument;
    case 409:
      return ErrorCode.Conflict;
    case 413:
      return ErrorCode.PayloadTooLarge;
    case 429:
      return ErrorCode.RateLimited;
    case 502:
    case 503:
      return ErrorCode.Unavailable;
    case 504:
      return ErrorCode.Timeout;
    default:
      return ErrorCode.Internal;
  }
}

/** errorFor returns the CubicleError (subclass) for an error code. */
export function errorFor(
  status: number,
  code: ErrorCodeName,
  message: string,
  index?: number,
  options?: CubicleErrorOptions,
): CubicleError {
  const Class = classes[code] ?? CubicleError;
  return new Class(status, code, message, index, options);
}

/** maxErrorText bounds how much of a body that is not JSON becomes a message. */
const maxErrorText = 200;

/**
 * parseErrorBody turns an error answer's status, body text and Retry-After
 * into a CubicleError. The action index is read from inside the error
 * object or beside it.
 */
export function parseErrorBody(status: number, text: string, retryAfterMs?: number): CubicleError {
  let code = "";
  let message = "";
  let index: number | undefined;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  const err = isObject(body) && isObject(body["error"]) ? body["error"] : undefined;
  if (err !== undefined) {
    code = typeof err["code"] === "string" ? err["code"] : "";
    message = typeof err["message"] === "string" ? err["message"] : "";
    const i = typeof err["index"] === "number" ? err["index"] : isObject(body) ? body["index"] : undefined;
    index = typeof i === "number" ? i : undefined;
  } else {
    message = text.trim();
    if (message.length > maxErrorText) {
      message = message.slice(0, maxErrorText) + "…";
    }
  }
  if (code === "") {
    code = codeForStatus(status);
  }
  if (message === "") {
    message = `HTTP ${status}`;
  }
  const opts: CubicleErrorOptions = { body };
  if (retryAfterMs !== undefined) {
    opts.retryAfterMs = retryAfterMs;
  }
  return errorFor(status, code, message, index, opts);
}

/**
 * ConnectionError is a request that got no complete answer from the daemon:
 * it could not connect, the connection broke, or a streamed exec ended
 * without an exit code. cause holds the underlying error.
 */
export class ConnectionError extends Error {
  override name = "ConnectionError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
