/**
 * @packageDocumentation
 * The TypeScript SDK of cubicle's native REST API: isolated virtual
 * desktops for AI agents. Start with {@link Cubicle}.
 */

export { Cubicle, DEFAULT_BASE_URL, VERSION, decodeBase64 } from "./client.js";
export type { CallOptions, CreateOptions, CubicleOptions, FileData, ListOptions } from "./client.js";
export { ExecStream } from "./exec-stream.js";
export type { FetchLike, RetryOptions } from "./transport.js";
export {
  CapacityExhaustedError,
  ConflictError,
  ConnectionError,
  CubicleError,
  ErrorCode,
  InternalError,
  InvalidArgumentError,
  NoDesktopError,
  NotFoundError,
  NotSupportedError,
  PayloadTooLargeError,
  PermissionDeniedError,
  RateLimitedError,
  TimeoutError,
  UnauthorizedError,
  UnavailableError,
  errorFor,
} from "./errors.js";
export type { CubicleErrorOptions, ErrorCodeName } from "./errors.js";
export type * from "./types.js";
export type * from "./computer.js";
