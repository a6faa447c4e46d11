package e2b

import (
	"time"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// clientID is the deprecated, still required clientID of E2B's schemas.
const clientID = "cubicle"

// noExpiry stands for the end of a sandbox without an expiry (possible only
// for sandboxes created through cubicle's own API with an unlimited
// lifetime): endAt is required and the SDK parses it as a date.
var noExpiry = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// sandboxBody is E2B's Sandbox schema, the answer of create and connect.
type sandboxBody struct {
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox schema. It has neither the access
// token nor the domain: a listing must not hand out credentials.
type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// sandboxDetail is E2B's SandboxDetail schema, the answer of get.
type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken string    `json:"envdAccessToken"`
	Domain          *string   `json:"domain"`
	Lifecycle       lifecycle `json:"lifecycle"`
}

// lifecycle is E2B's SandboxLifecycle: a cubicle sandbox is always killed
// at its timeout and never resumes.
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// logsV1Body is E2B's SandboxLogs (deprecated logs endpoint).
type logsV1Body struct {
	Logs       []logLineBody  `json:"logs"`
	LogEntries []logEntryBody `json:"logEntries"`
}

// logsV2Body is E2B's SandboxLogsV2Response.
type logsV2Body struct {
	Logs []logEntryBody `json:"logs"`
}

// resources are the vCPUs and memory a backend gives a sandbox when the
// request names none, which an E2B create never does. They repeat the
// drivers' defaults (internal/driver/*/DefaultVCPUs, DefaultMemoryMB) so
// that this package need not import the drivers.
func resources(backend string) (cpus, memoryMB int) {
	if backend == "qemu" {
		return 2, 1024
	}
	return 2, 2048
}

// live reports whether a sandbox exists for this API: E2B has no stopping
// or stopped sandboxes, only running (and paused) ones.
func live(st sandbox.State) bool {
	switch st {
	case sandbox.StateStarting, sandbox.StateRunning, sandbox.StatePausing, sandbox.StatePaused, sandbox.StateResuming:
		return true
	}
	return false
}

// paused reports whether a live sandbox shows as "paused": one pausing
// is paused as far as its caller can tell, one resuming not yet running.
func paused(st sandbox.State) bool {
	return st == sandbox.StatePausing || st == sandbox.StatePaused || st == sandbox.StateResuming
}

// e2bState is the state E2B shows for a live sandbox.
func e2bState(st sandbox.State) string {
	if paused(st) {
		return "paused"
	}
	return "running"
}

// e2bTemplate is the E2B name shown for a cubicle template.
func (s *Server) e2bTemplate(tmpl string) string {
	if name, ok := s.names[tmpl]; ok {
		return name
	}
	return tmpl
}

// domain is Config.Domain, or null.
func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

// sandboxBody is the Sandbox answer for sb; template is the E2B name the
// client used, or "" for the one shown in listings.
func (s *Server) sandboxBody(sb sandbox.Sandbox, template string) sandboxBody {
	if template == "" {
		template = s.e2bTemplate(sb.Template)
	}
	return sandboxBody{
		TemplateID:      template,
		Alias:           template,
		SandboxID:       sb.ID,
		ClientID:        clientID,
		EnvdVersion:     s.cfg.EnvdVersion,
		EnvdAccessToken: AccessToken(s.cfg.TokenKey, sb.ID),
		Domain:          s.domain(),
	}
}

// listed is the ListedSandbox answer for sb.
func (s *Server) listed(sb sandbox.Sandbox) listedSandbox {
	cpus, mem := resources(sb.Backend)
	end := sb.ExpiresAt
	if end.IsZero() {
		end = noExpiry
	}
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	template := s.e2bTemplate(sb.Template)
	return listedSandbox{
		TemplateID:  template,
		Alias:       template,
		SandboxID:   sb.ID,
		ClientID:    clientID,
		StartedAt:   sb.CreatedAt.UTC(),
		EndAt:       end.UTC(),
		CPUCount:    cpus,
		MemoryMB:    mem,
		Metadata:    md,
		State:       e2bState(sb.State),
		EnvdVersion: s.cfg.EnvdVersion,
	}
}

// detail is the SandboxDetail answer for sb.
func (s *Server) detail(sb sandbox.Sandbox) sandboxDetail {
	return sandboxDetail{
		listedSandbox:   s.listed(sb),
		EnvdAccessToken: AccessToken(s.cfg.TokenKey, sb.ID),
		Domain:          s.domain(),
		Lifecycle:       lifecycle{AutoResume: false, OnTimeout: onTimeout(sb)},
	}
}

// secondsDuration converts E2B seconds to a duration.
func secondsDuration(s int) time.Duration { return time.Duration(s) * time.Second }

// onTimeout is what E2B says happens to sb at its timeout.
func onTimeout(sb sandbox.Sandbox) string {
	if sb.AutoPause {
		return "pause"
	}
	return "kill"
}
