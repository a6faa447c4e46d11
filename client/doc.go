// Package client is the Go SDK for the cubicle REST API (API.md, served by
// cubicled under /v1). It is public: programs outside this module import it to
// create sandboxes, drive their desktops, run commands and move files, and
// the cubicle CLI is built on it. It depends on the standard library only and
// imports nothing else of the project, so the daemon's internals can change
// without breaking SDK users.
//
// Every call takes a context. Errors returned by the daemon are *APIError
// values; use errors.As or the IsNotFound family of helpers to inspect them.
//
// Retries: a Client retries idempotent requests (GET, DELETE, and a file
// upload whose body can be rewound) on connection errors and on 502, 503 and
// 504 answers, with exponential backoff and jitter (see WithRetry). It never
// retries a POST — creating a sandbox, running actions, running a command or
// minting a view URL twice is not harmless.
package client
