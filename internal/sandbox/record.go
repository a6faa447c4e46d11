package sandbox

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// record is what the manager keeps of one sandbox: enough to answer the
// API and to re-adopt the box after a daemon restart. It lives in memory
// in this form; the store holds it as a storedRecord.
type record struct {
	Sandbox     Sandbox
	Request     CreateRequest
	Token       string
	IdleTimeout time.Duration
	DriverState *driver.State // of the running box, or of the paused one
	StoppedAt   time.Time
	// Life is, while paused, the running time the sandbox had left when
	// it paused (-1: no limit), given back when it resumes.
	Life time.Duration
	// Pool is the warm pool (PoolSpec.String) of a box booted for one
	// and not claimed yet; such a record is never stored.
	Pool string
}

// recordVersion is the version of the stored record this daemon writes.
// Version 1 (no "v" member) was the REST view itself, sandbox and request
// under their API names; it is still read.
const recordVersion = 2

// storedRecord is a record as the store keeps it (version 2). Its JSON
// names belong to the store alone: the REST types can rename or drop a
// field without making an existing store unreadable, and a field added
// here needs a rule for records that lack it, in decodeRecord.
type storedRecord struct {
	Version       int               `json:"v"`
	ID            string            `json:"id"`
	State         string            `json:"state"`
	Template      string            `json:"template"`
	Backend       string            `json:"backend"`
	Isolation     string            `json:"isolation"`
	Width         int               `json:"width"`
	Height        int               `json:"height"`
	CreatedAt     time.Time         `json:"created"`
	ExpiresAt     time.Time         `json:"expires,omitzero"`
	LastActiveAt  time.Time         `json:"last_active"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	IP            string            `json:"ip,omitempty"`
	Desktop       *bool             `json:"desktop,omitempty"`
	Error         string            `json:"error,omitempty"`
	Token         string            `json:"token"`
	IdleTimeoutMS int64             `json:"idle_ms"`
	StoppedAt     time.Time         `json:"stopped,omitzero"`
	Driver        *storedDriver     `json:"driver,omitempty"`
	PausedAt      time.Time         `json:"paused,omitzero"`
	PausedBytes   int64             `json:"paused_bytes,omitempty"`
	LifeMS        int64             `json:"life_ms,omitempty"`
	Request       storedRequest     `json:"request"`
}

// storedDriver is a driver.State in the store.
type storedDriver struct {
	Version int             `json:"v"`
	Name    string          `json:"name"`
	Data    json.RawMessage `json:"data"`
}

// storedRequest is a CreateRequest in the store.
type storedRequest struct {
	Template           string            `json:"template,omitempty"`
	Backend            string            `json:"backend,omitempty"`
	Width              int               `json:"width,omitempty"`
	Height             int               `json:"height,omitempty"`
	DPI                int               `json:"dpi,omitempty"`
	VCPUs              int               `json:"vcpus,omitempty"`
	MemoryMB           int               `json:"memory_mb,omitempty"`
	TimeoutSeconds     int               `json:"timeout_s,omitempty"`
	IdleTimeoutSeconds int               `json:"idle_timeout_s,omitempty"`
	StartURL           string            `json:"start_url,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	Egress             string            `json:"egress,omitempty"`
	Allow              []string          `json:"allow,omitempty"`
	Owner              string            `json:"owner,omitempty"`
	Volumes            []storedMount     `json:"volumes,omitempty"`
	AutoPause          bool              `json:"auto_pause,omitempty"`
	// FromSnapshot is empty in records from before snapshots: such
	// sandboxes were all created cold.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// storeRequest gives the stored form of q.
func storeRequest(q CreateRequest) storedRequest {
	s := storedRequest{
		Template: q.Template, Backend: q.Backend, Width: q.Resolution.Width, Height: q.Resolution.Height,
		DPI: q.DPI, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB,
		TimeoutSeconds: q.TimeoutSeconds, IdleTimeoutSeconds: q.IdleTimeoutSeconds,
		StartURL: q.StartURL, Env: q.Env, Metadata: q.Metadata,
		Egress: q.Network.Egress, Allow: q.Network.Allow, Owner: q.Owner, AutoPause: q.AutoPause,
		FromSnapshot: q.FromSnapshot,
	}
	for _, v := range q.Volumes {
		s.Volumes = append(s.Volumes, storedMount(v))
	}
	return s
}

// request reads a stored request back.
func (q storedRequest) request() CreateRequest {
	r := CreateRequest{
		Template: q.Template, Backend: q.Backend, Resolution: Resolution{Width: q.Width, Height: q.Height},
		DPI: q.DPI, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB,
		TimeoutSeconds: q.TimeoutSeconds, IdleTimeoutSeconds: q.IdleTimeoutSeconds,
		StartURL: q.StartURL, Env: q.Env, Metadata: q.Metadata,
		Network: Network{Egress: q.Egress, Allow: q.Allow}, Owner: q.Owner, AutoPause: q.AutoPause,
		FromSnapshot: q.FromSnapshot,
	}
	for _, v := range q.Volumes {
		r.Volumes = append(r.Volumes, VolumeMount(v))
	}
	return r
}

// storedMount is a VolumeMount in the store.
type storedMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// encodeRecord gives the stored form of r, at recordVersion.
func encodeRecord(r *record) ([]byte, error) {
	sb, q := r.Sandbox, r.Request
	s := storedRecord{
		Version: recordVersion,
		ID:      sb.ID, State: string(sb.State), Template: sb.Template, Backend: sb.Backend, Isolation: sb.Isolation,
		Width: sb.Resolution.Width, Height: sb.Resolution.Height,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, LastActiveAt: sb.LastActiveAt,
		Metadata: sb.Metadata, IP: sb.IP, Desktop: sb.Desktop, Error: sb.Error,
		Token: r.Token, IdleTimeoutMS: r.IdleTimeout.Milliseconds(), StoppedAt: r.StoppedAt,
		PausedAt: sb.PausedAt, PausedBytes: sb.PausedBytes, LifeMS: r.Life.Milliseconds(),
		Request: storeRequest(q),
	}
	if d := r.DriverState; d != nil {
		s.Driver = &storedDriver{Version: d.Version, Name: d.Driver, Data: d.Data}
	}
	return json.Marshal(&s)
}

// decodeRecord reads a stored record of any version this daemon knows,
// filling in what older records lack. A record of a newer version is an
// error: a downgraded daemon must not guess at, and then overwrite, what a
// newer one wrote.
func decodeRecord(b []byte) (*record, error) {
	var v struct {
		V *int `json:"v"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	switch {
	case v.V == nil:
		return decodeV1(b)
	case *v.V == recordVersion:
		return decodeV2(b)
	default:
		return nil, fmt.Errorf("record version %d: this cubicled reads versions 1 to %d (was the data directory used by a newer cubicled?)", *v.V, recordVersion)
	}
}

func decodeV2(b []byte) (*record, error) {
	var s storedRecord
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	r := &record{
		Sandbox: Sandbox{
			ID: s.ID, State: State(s.State), Template: s.Template, Backend: s.Backend, Isolation: s.Isolation,
			Resolution: Resolution{Width: s.Width, Height: s.Height},
			CreatedAt:  s.CreatedAt, ExpiresAt: s.ExpiresAt, LastActiveAt: s.LastActiveAt,
			Metadata: s.Metadata, IP: s.IP, Desktop: s.Desktop, Error: s.Error,
			PausedAt: s.PausedAt, PausedBytes: s.PausedBytes,
		},
		Request: s.Request.request(),
		Token:   s.Token, IdleTimeout: time.Duration(s.IdleTimeoutMS) * time.Millisecond, StoppedAt: s.StoppedAt,
		Life: time.Duration(s.LifeMS) * time.Millisecond,
	}
	if r.Sandbox.Metadata == nil {
		r.Sandbox.Metadata = map[string]string{}
	}
	r.Sandbox.Volumes = r.Request.Volumes
	r.Sandbox.AutoPause = r.Request.AutoPause
	r.Sandbox.FromSnapshot = r.Request.FromSnapshot
	if d := s.Driver; d != nil {
		r.DriverState = &driver.State{Version: d.Version, Driver: d.Name, Data: d.Data}
	}
	return r, nil
}

// v1Record and the types under it are version 1 of the stored record,
// frozen: they were the REST types of that time, and stay as they were
// whatever the REST types become.
type v1Record struct {
	Sandbox struct {
		ID         string    `json:"id"`
		State      string    `json:"state"`
		Template   string    `json:"template"`
		Backend    string    `json:"backend"`
		Isolation  string    `json:"isolation"`
		Resolution v1Size    `json:"resolution"`
		CreatedAt  time.Time `json:"created_at"`
		ExpiresAt  time.Time `json:"expires_at"`
		LastActive time.Time `json:"last_active_at"`
		Metadata   v1Strings `json:"metadata"`
		IP         string    `json:"ip"`
		Desktop    *bool     `json:"desktop"`
		Error      string    `json:"error"`
	} `json:"sandbox"`
	Request struct {
		Template           string    `json:"template"`
		Backend            string    `json:"backend"`
		Resolution         v1Size    `json:"resolution"`
		DPI                int       `json:"dpi"`
		VCPUs              int       `json:"vcpus"`
		MemoryMB           int       `json:"memory_mb"`
		TimeoutSeconds     int       `json:"timeout_seconds"`
		IdleTimeoutSeconds int       `json:"idle_timeout_seconds"`
		StartURL           string    `json:"start_url"`
		Env                v1Strings `json:"env"`
		Metadata           v1Strings `json:"metadata"`
		Network            struct {
			Egress string   `json:"egress"`
			Allow  []string `json:"allow"`
		} `json:"network"`
		Owner string `json:"owner"`
	} `json:"request"`
	Token       string        `json:"token"`
	IdleTimeout time.Duration `json:"idle_timeout"`
	DriverState *struct {
		Version int             `json:"version"`
		Driver  string          `json:"driver"`
		Data    json.RawMessage `json:"data"`
	} `json:"driver_state"`
	StoppedAt time.Time `json:"stopped_at"`
}

type v1Size struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

type v1Strings = map[string]string

func decodeV1(b []byte) (*record, error) {
	var o v1Record
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, err
	}
	sb, q := o.Sandbox, o.Request
	r := &record{
		Sandbox: Sandbox{
			ID: sb.ID, State: State(sb.State), Template: sb.Template, Backend: sb.Backend, Isolation: sb.Isolation,
			Resolution: Resolution(sb.Resolution),
			CreatedAt:  sb.CreatedAt, ExpiresAt: sb.ExpiresAt, LastActiveAt: sb.LastActive,
			Metadata: sb.Metadata, IP: sb.IP, Desktop: sb.Desktop, Error: sb.Error,
		},
		Request: CreateRequest{
			Template: q.Template, Backend: q.Backend, Resolution: Resolution(q.Resolution),
			DPI: q.DPI, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB,
			TimeoutSeconds: q.TimeoutSeconds, IdleTimeoutSeconds: q.IdleTimeoutSeconds,
			StartURL: q.StartURL, Env: q.Env, Metadata: q.Metadata,
			Network: Network{Egress: q.Network.Egress, Allow: q.Network.Allow}, Owner: q.Owner,
		},
		Token: o.Token, IdleTimeout: o.IdleTimeout, StoppedAt: o.StoppedAt,
	}
	if r.Sandbox.Metadata == nil {
		r.Sandbox.Metadata = map[string]string{}
	}
	if d := o.DriverState; d != nil {
		r.DriverState = &driver.State{Version: d.Version, Driver: d.Driver, Data: d.Data}
	}
	if sb.Desktop == nil && r.Sandbox.State != StateStarting && r.Sandbox.State != StateFailed {
		yes := true // before headless sandboxes, every sandbox had a desktop
		r.Sandbox.Desktop = &yes
	}
	return r, nil
}
