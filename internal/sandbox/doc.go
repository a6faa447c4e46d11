// Package sandbox is the backend-agnostic sandbox manager: the state machine
// (starting → running → stopping → stopped | failed), the embedded store, the
// reaper of idle, expired and dead sandboxes, capacity, and re-adoption after a
// daemon restart. It reaches the isolation backends only through the
// internal/driver interface and must not import a driver package.
package sandbox
