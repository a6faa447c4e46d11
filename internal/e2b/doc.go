// Package e2b is cubicled's E2B-compatible control plane: the REST API of
// E2B's spec/openapi.yml (create, list, get, extend, connect to and kill
// sandboxes) answered from cubicle's sandbox manager, so that the unmodified
// e2b and @e2b/desktop SDKs (JS e2b 2.51.0, @e2b/desktop 2.4.0) work against
// a cubicle daemon. It also computes the envd access token (token.go) that
// the E2B data plane (internal/dataplane) checks.
//
// It consumes the manager through the small Manager interface defined here.
// Only cmd/cubicled (which mounts Routes next to the cubicle API) and tests
// should import it.
//
// # Wire
//
// Paths, JSON field names and status codes are E2B's. Every error is
// {"code": <HTTP status>, "message": "..."}, E2B's Error schema, because the
// SDKs read .message and turn 401 into AuthenticationError and 429 into
// RateLimitError. Both the v1 routes of the spec and the v2 routes that the
// 2.x SDKs call (POST /v2/sandboxes, POST /v2/sandboxes/{id}/connect) are
// served; the v2 ones differ only in their defaults (timeout 300 s instead of
// 15 s; connect's body is optional). Unknown paths answer 404 and known
// paths with another method 405, without asking for a key.
//
// # NewSandbox fields
//
// Honoured:
//   - templateID (required): an E2B template ID or alias, mapped to a cubicle
//     template by Config.Templates. An unknown one is 400 and the message
//     lists the known ones.
//   - timeout: seconds to live, E2B's default when absent. E2B's 0 means
//     "expire now"; cubicle's manager reads 0 as "the maximum", so 0 becomes
//     1 s. It is capped at the longest any API lets a sandbox live (366
//     days, sandbox.MaxTimeoutSeconds), and the manager caps it at the
//     daemon's maximum lifetime.
//   - envVars: the sandbox's environment (names must be POSIX names).
//
// envVars, metadata and the egress allow-list are bounded by the rules
// every API shares (sandbox.ValidateCreate), so this API admits the same
// sandboxes as cubicle's own; a body must be valid UTF-8.
//   - metadata: string to string, listed and filtered on as E2B does.
//   - allow_internet_access and network.allowOut / network.denyOut, as far
//     as cubicle's egress policy (none, all, or a CIDR allow-list) can say
//     them: allow_internet_access: false or a denyOut naming all traffic
//     (0.0.0.0/0 or ::/0) gives no egress, or only the CIDRs of allowOut;
//     allow_internet_access: true asks for all egress (a daemon without a
//     network answers 503). Absent, the daemon's default applies, which for
//     cubicle is no egress: that differs from E2B on purpose.
//   - volumeMounts ([{name, path}]): cubicle volumes of the same API key
//     (made with the native API's POST /v1/volumes), attached as its
//     "volumes" are; a missing one is 404, one in use 409.
//
// autoPause: true (lifecycle onTimeout "pause") makes the sandbox pause
// at its timeout instead of dying, where its backend can pause (gvisor,
// qemu); elsewhere the create is refused with 501, since the sandbox
// would be killed at its timeout and its state lost.
//
// Refused with 400, because ignoring them would quietly give the caller
// something else than asked: autoResume.enabled: true (cubicle resumes on
// connect, not on traffic), network.egressProxy (traffic would go out
// directly), a denyOut that lists only some destinations, and an allowOut
// naming domains (cubicle filters by address only).
//
// Accepted and ignored: secure (every sandbox gets an envd access token
// anyway, see AccessToken), autoPause: false, autoPauseMemory (a pause
// always keeps the memory: more than a false asks for), autoResume
// without enabled: true, pause's memory,
// mcp, iam, network.allowPublicTraffic, network.maskRequestHost,
// network.rules, and any field this package does not know, since newer SDKs
// send fields that did not exist when it was written.
//
// # Choices made here
//
//   - The idle timeout of an E2B sandbox is set out of reach (a year), not to
//     its timeout: E2B has no idle reaper, and an idle timeout equal to the
//     create timeout would reap the sandbox early once setTimeout extended
//     it, because the Manager interface cannot change a sandbox's idle
//     timeout later.
//   - Only live sandboxes (cubicle states starting and running, shown as
//     "running", and pausing, paused and resuming, shown as "paused")
//     exist for this API. Stopping, stopped and failed ones
//     are 404 for get, connect, timeout, pause, metrics and kill: E2B
//     forgets a killed sandbox at once, and the SDK's kill() returns false on
//     404, which is the truth for a sandbox that is already gone.
//   - POST /sandboxes/{id}/pause answers 204 once the sandbox is paused,
//     409 when it is paused already (the SDK's pause() returns false), and
//     501 where its backend cannot pause (runc): the SDK reads 409 as
//     "already paused", which would be a lie about a sandbox that keeps
//     running, while 501 surfaces as an error carrying the reason.
//     connect of a paused sandbox resumes it (201), of a running one
//     extends it (200); the deprecated resume answers 201 or 409. A
//     paused sandbox is listed and shown with state "paused".
//   - cpuCount and memoryMB are the backend's defaults (E2B's create cannot
//     ask for others); diskSizeMB is 0 (unknown).
//   - Logs (v1 and v2) are what the sandbox printed on its console: the
//     agent's structured log (session programs starting and exiting, with
//     their fields) and the lines of the programs and, in a VM, the kernel
//     (sandbox.Manager.Logs): the newest 5000 lines or 1 MiB, each at most
//     4 KiB. Unlike the other endpoints they answer for a stopped sandbox
//     as long as cubicle lists it (10 minutes by default), as E2B keeps a
//     killed sandbox's logs; then 404. A line's timestamp is the agent's
//     own or when cubicled read it (within 5 s); timestamps are unique and
//     follow the order of printing.
//   - getMetrics answers the samples cubicle keeps of every live sandbox
//     (every 5 s, for 10 minutes, by default: sandbox.Usage) between start
//     and end, measured from the host (the cgroup, or the VMM process), not
//     from inside as E2B's envd does: cpuUsedPct is the share of the
//     sandbox's CPUs, memUsed its memory less inactive page cache (a VM's
//     resident set), diskUsed its own writable disk without the image, and
//     cpuCount its CPU quota rounded up.
//   - envdVersion is Config.EnvdVersion, "0.5.7" by default: the oldest
//     version that turns on everything the 2.51.0 SDK gates below it (stdin
//     flag 0.3.0, default user 0.4.0, close stdin 0.5.2, octet-stream upload
//     0.5.7) and nothing above it (file metadata 0.6.2, watch extras
//     0.6.3/0.6.4), which the SDK then refuses cleanly instead of calling.
package e2b
