package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/strictjson"
)

var (
	sandboxID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	// sandboxIDPattern is what the daemon's own ids look like, for
	// query parameters that name one.
	sandboxIDPattern = regexp.MustCompile(`^[a-z0-9]{1,128}$`)
	states           = map[sandbox.State]bool{
		sandbox.StateStarting: true, sandbox.StateRunning: true, sandbox.StateStopping: true,
		sandbox.StateStopped: true, sandbox.StateFailed: true,
		sandbox.StatePausing: true, sandbox.StatePaused: true, sandbox.StateResuming: true,
		sandbox.StateLost: true,
	}
)

// createRequest is the wire form of POST /v1/sandboxes.
type createRequest struct {
	Template           string              `json:"template"`
	Backend            string              `json:"backend"`
	Resolution         *sandbox.Resolution `json:"resolution"`
	DPI                int                 `json:"dpi"`
	VCPUs              int                 `json:"vcpus"`
	MemoryMB           int                 `json:"memory_mb"`
	TimeoutSeconds     int                 `json:"timeout_seconds"`
	IdleTimeoutSeconds int                 `json:"idle_timeout_seconds"`
	StartURL           string              `json:"start_url"`
	Env                map[string]string   `json:"env"`
	Metadata           map[string]string   `json:"metadata"`
	Network            *networkSpec        `json:"network"`
	Volumes            []volumeMount       `json:"volumes"`
	AutoPause          bool                `json:"auto_pause"`
	FromSnapshot       string              `json:"from_snapshot"`
}

// volumeMount is the wire form of one entry of "volumes".
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// networkSpec is the wire form of "network".
type networkSpec struct {
	Egress egressSpec `json:"egress"`
}

// egressSpec is "none", "all" or {"allow": ["CIDR", ...]}.
type egressSpec struct {
	mode  string
	allow []string
}

// UnmarshalJSON decodes the union form of "egress".
func (e *egressSpec) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		*e = egressSpec{}
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return invalidf(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}`)
		}
		if s == "" {
			// "" would read as no policy, the daemon's default.
			return invalidf(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}, not ""`)
		}
		*e = egressSpec{mode: s} // "none" or "all": sandbox.ValidateCreate checks
		return nil
	case len(data) > 0 && data[0] == '{':
		var obj struct {
			Allow []string `json:"allow"`
		}
		if err := strictjson.Decode(data, &obj); err != nil {
			return invalidf("network.egress: %s", err)
		}
		if len(obj.Allow) == 0 {
			return invalidf(`network.egress.allow must list at least one CIDR (use "none" to allow nothing)`)
		}
		// Each entry is checked by sandbox.ValidateCreate.
		*e = egressSpec{allow: obj.Allow}
		return nil
	}
	return invalidf(`network.egress must be "none", "all" or {"allow": [CIDR, ...]}`)
}

// parseCreateRequest decodes and validates the body of POST /v1/sandboxes.
// Errors are 400 invalid_argument with a message for users.
func parseCreateRequest(body []byte) (sandbox.CreateRequest, error) {
	var in createRequest
	if err := decodeStrict(body, &in); err != nil {
		return sandbox.CreateRequest{}, err
	}
	out := sandbox.CreateRequest{
		Template:           in.Template,
		Backend:            in.Backend,
		DPI:                in.DPI,
		VCPUs:              in.VCPUs,
		MemoryMB:           in.MemoryMB,
		TimeoutSeconds:     in.TimeoutSeconds,
		IdleTimeoutSeconds: in.IdleTimeoutSeconds,
		StartURL:           in.StartURL,
		Env:                in.Env,
		Metadata:           in.Metadata,
		AutoPause:          in.AutoPause,
		FromSnapshot:       in.FromSnapshot,
	}
	if res := in.Resolution; res != nil {
		out.Resolution = *res
	}
	if in.Network != nil {
		out.Network = sandbox.Network{Egress: in.Network.Egress.mode, Allow: in.Network.Egress.allow}
	}
	for _, v := range in.Volumes {
		out.Volumes = append(out.Volumes, sandbox.VolumeMount(v))
	}
	out, err := sandbox.ValidateCreate(out)
	if err != nil {
		return out, invalidf("%s", err)
	}
	return out, nil
}

// pathID returns the sandbox id of the request's path, or a 404 error when
// it cannot be a sandbox id.
func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if !sandboxID.MatchString(id) {
		return "", &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "sandbox not found"}
	}
	return id, nil
}

func (s *server) createSandbox(w http.ResponseWriter, r *http.Request) {
	if !s.create.Allow() {
		w.Header().Set("Retry-After", "1")
		s.writeError(w, r, &httpError{status: http.StatusTooManyRequests, code: codeRateLimited,
			msg: "too many sandbox creations; retry later"})
		return
	}
	wait := true
	if v := r.URL.Query().Get("wait"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeError(w, r, invalidf("wait must be true or false, not %q", v))
			return
		}
		wait = b
	}
	body, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := parseCreateRequest(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.Owner = s.keys.Owner(r)
	if s.clusterCreate(w, r, req, body) {
		return
	}
	sb, err := s.mgr.Create(r.Context(), req, wait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Cluster != nil {
		sb.Node = s.cfg.Cluster.Name()
		s.catalogPut(r.Context(), sb, req.Owner)
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	writeJSON(w, http.StatusCreated, sb)
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	var f sandbox.Filter
	for k, vs := range r.URL.Query() {
		switch {
		case k == "state":
			st := sandbox.State(vs[0])
			if len(vs) != 1 || !states[st] {
				s.writeError(w, r, invalidf("state must be one of starting, running, pausing, paused, resuming, stopping, stopped, failed, lost"))
				return
			}
			f.State = st
		case strings.HasPrefix(k, "metadata."):
			key := strings.TrimPrefix(k, "metadata.")
			if key == "" || len(vs) != 1 {
				s.writeError(w, r, invalidf("metadata filters are metadata.KEY=VALUE, each key once"))
				return
			}
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[key] = vs[0]
		}
	}
	var list []sandbox.Sandbox
	if f.State != sandbox.StateLost {
		list = s.mgr.List(r.Context(), f)
	}
	if s.cfg.Cluster != nil {
		list = s.clusterList(r, list, f)
	}
	if list == nil {
		list = []sandbox.Sandbox{}
	}
	writeJSON(w, http.StatusOK, struct {
		Sandboxes []sandbox.Sandbox `json:"sandboxes"`
	}{list})
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Cluster != nil {
		sb.Node = s.cfg.Cluster.Name()
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.Destroy(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.catalogRemove(r.Context(), id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in struct {
		TimeoutSeconds *int `json:"timeout_seconds"`
	}
	if err := decodeJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	if in.TimeoutSeconds == nil {
		s.writeError(w, r, invalidf("timeout_seconds is required"))
		return
	}
	if err := sandbox.CheckTimeout("timeout_seconds", *in.TimeoutSeconds); err != nil {
		s.writeError(w, r, invalidf("%s", err))
		return
	}
	sb, err := s.mgr.SetTimeout(r.Context(), id, *in.TimeoutSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.here(sb))
}

// here marks a sandbox this node answers about with the node's name in
// cluster mode (every Sandbox object then says where it runs).
func (s *server) here(sb sandbox.Sandbox) sandbox.Sandbox {
	if s.cfg.Cluster != nil {
		sb.Node = s.cfg.Cluster.Name()
	}
	return sb
}

func (s *server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := decodeOptionalEmpty(w, r, s.cfg.MaxBodyBytes); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.mgr.Pause(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.here(sb))
}

// forkResponse is the answer of POST /v1/sandboxes/{id}/fork.
type forkResponse struct {
	Sandboxes []sandbox.Sandbox `json:"sandboxes"`
}

func (s *server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	in := struct {
		Count *int `json:"count"`
	}{}
	if err := decodeOptionalJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	count := 1
	if in.Count != nil {
		count = *in.Count
	}
	if count < 1 || count > sandbox.MaxForks {
		s.writeError(w, r, invalidf("count must be 1..%d, not %d", sandbox.MaxForks, count))
		return
	}
	sbs, err := s.mgr.Fork(r.Context(), id, s.keys.Owner(r), count)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.cfg.Cluster != nil {
		for i := range sbs {
			sbs[i].Node = s.cfg.Cluster.Name()
			s.catalogPut(r.Context(), sbs[i], s.keys.Owner(r))
		}
	}
	writeJSON(w, http.StatusCreated, forkResponse{Sandboxes: sbs})
}

func (s *server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in struct {
		TimeoutSeconds int `json:"timeout_seconds"`
	}
	if err := decodeOptionalJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := sandbox.CheckTimeout("timeout_seconds", in.TimeoutSeconds); err != nil {
		s.writeError(w, r, invalidf("%s", err))
		return
	}
	sb, err := s.mgr.Resume(r.Context(), id, in.TimeoutSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.here(sb))
}
