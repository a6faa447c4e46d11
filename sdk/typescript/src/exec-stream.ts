/**
 * The streamed form of exec: the daemon's application/x-ndjson lines
 * ({"stdout": …}, {"stderr": …}, {"truncated": true}, then {"exit_code": N,
 * "duration_ms": M}, or a final {"error": {…}}) read as ExecEvents.
 */

import { ConnectionError, errorFor } from "./errors.js";
import { connectionError } from "./transport.js";
import type { ExecEvent, ExecResult } from "./types.js";

/**
 * ExecStream is a running command's output as it arrives. Iterate it with
 * for await … of to get its ExecEvents: chunks of stdout and stderr, then
 * one "exit" event with the exit code, after which iteration ends; or call
 * wait() to collect the rest of it into an ExecResult. It can be consumed
 * once. Leaving the loop early (break, an exception) or cancel() closes the
 * connection; the command itself is not killed (give timeout_seconds).
 *
 * An error the daemon reports mid-stream is thrown by the iteration as a
 * CubicleError with status 0; a stream that ends without an exit code as a
 * ConnectionError.
 */
export class ExecStream implements AsyncIterable<ExecEvent> {
  /** The exit code, once the "exit" event has been read. */
  exitCode: number | undefined;
  readonly #events: AsyncGenerator<ExecEvent, void, undefined>;
  #used = false;

  /** @internal Use Cubicle.execStream. */
  constructor(body: ReadableStream<Uint8Array>, signal: AbortSignal | undefined) {
    this.#events = this.#read(body, signal);
  }

  [Symbol.asyncIterator](): AsyncIterator<ExecEvent> {
    if (this.#used) {
      throw new Error("ExecStream: already consumed");
    }
    this.#used = true;
    return this.#events;
  }

  /**
   * wait reads the rest of the stream and returns the command's output and
   * exit code; chunks already taken by an iteration are not in it.
   */
  async wait(): Promise<ExecResult> {
    const out: ExecResult = { exit_code: -1, stdout: "", stderr: "", duration_ms: 0 };
    this.#used = true;
    for await (const ev of this.#events) {
      switch (ev.type) {
        case "stdout":
          out.stdout += ev.data;
          break;
        case "stderr":
          out.stderr += ev.data;
          break;
        case "truncated":
          out.truncated = true;
          break;
        case "exit":
          out.exit_code = ev.exit_code;
          out.duration_ms = ev.duration_ms ?? 0;
          if (ev.timed_out) {
            out.timed_out = true;
          }
          break;
      }
    }
    if (this.exitCode === undefined) {
      throw new Error("ExecStream: the stream was closed before its exit code");
    }
    return out;
  }

  /** cancel stops reading and closes the connection. */
  async cancel(): Promise<void> {
    this.#used = true;
    await this.#events.return(undefined);
  }

  async *#read(body: ReadableStream<Uint8Array>, signal: AbortSignal | undefined): AsyncGenerator<ExecEvent, void, undefined> {
    const reader = body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch (err) {
          throw connectionError(err, signal, "exec stream");
        }
        if (chunk.done) {
          break;
        }
        buf += dec.decode(chunk.value, { stream: true });
        for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          for (const ev of parseLine(line)) {
            yield ev;
            if (ev.type === "exit") {
              this.exitCode = ev.exit_code;
              return;
            }
          }
        }
      }
      buf += dec.decode();
      for (const ev of parseLine(buf)) {
        yield ev;
        if (ev.type === "exit") {
          this.exitCode = ev.exit_code;
          return;
        }
      }
      throw new ConnectionError("exec stream ended without an exit code");
    } finally {
      reader.cancel().catch(() => {});
    }
  }
}

/** parseLine returns the events of one NDJSON line; an error line is thrown. */
export function parseLine(line: string): ExecEvent[] {
  if (line.trim() === "") {
    return [];
  }
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (err) {
    throw new ConnectionError(`exec stream: bad line ${JSON.stringify(line.slice(0, 100))}`, { cause: err });
  }
  if (typeof v !== "object" || v === null) {
    return [];
  }
  const o = v as Record<string, unknown>;
  const e = o["error"];
  if (typeof e === "object" && e !== null) {
    const code = (e as Record<string, unknown>)["code"];
    const message = (e as Record<string, unknown>)["message"];
    throw errorFor(0, typeof code === "string" ? code : "internal", typeof message === "string" ? message : "exec failed", undefined, { body: v });
  }
  const out: ExecEvent[] = [];
  if (typeof o["stdout"] === "string" && o["stdout"] !== "") {
    out.push({ type: "stdout", data: o["stdout"] });
  }
  if (typeof o["stderr"] === "string" && o["stderr"] !== "") {
    out.push({ type: "stderr", data: o["stderr"] });
  }
  if (o["truncated"] === true) {
    out.push({ type: "truncated" });
  }
  if (typeof o["exit_code"] === "number") {
    const ev: ExecEvent = { type: "exit", exit_code: o["exit_code"] };
    if (typeof o["duration_ms"] === "number") {
      ev.duration_ms = o["duration_ms"];
    }
    if (o["timed_out"] === true) {
      ev.timed_out = true;
    }
    out.push(ev);
  }
  return out;
}
