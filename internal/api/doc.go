// Package api is the daemon's REST API (shared/API.md): the HTTP handlers of
// /v1, the auth, logging and recovery middleware, the one mapping of error
// kinds to HTTP status and API error code, and the OpenAPI document served at
// GET /v1/openapi.json.
//
// It consumes the sandbox manager through the small Manager interface defined
// here and reaches each sandbox's agent through internal/agentclient. Only
// cmd/cubicled (and tests) should import it.
//
// Choices the contract leaves open, made here:
//   - errdefs.ErrNotSupported answers 409 with code "not_supported";
//     errdefs.ErrCapacity answers 503 "capacity_exhausted" (429 when it
//     is one API key's quota, errdefs.ErrQuota); an unreachable
//     agent answers 503 "unavailable".
//   - Unknown routes answer 404 "not_found", known paths with a wrong
//     method 405 "method_not_allowed" (with Allow), both only after auth.
//   - A failing action answers {"error": {"code", "message", "index"},
//     "results": [...]} with the results of the actions before it.
//   - Streaming exec (Accept: application/x-ndjson) writes one JSON object
//     per line: {"stdout": "..."} / {"stderr": "..."}, then {"truncated": true}
//     if the output was capped, then {"exit_code": N, "duration_ms": M} (plus
//     "timed_out": true when timeout_seconds killed the command, as in the
//     JSON answer); an error after the stream started is a final
//     {"error": {...}} line.
//   - File paths must be absolute and must not contain a ".." component.
//   - Live view (POST .../view, GET .../vnc, GET /view/{id}) is not
//     registered yet and answers 404.
package api
