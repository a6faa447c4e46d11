package api

import (
	_ "embed"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// openAPIDoc is the OpenAPI 3 document of the API, served as is.
//
//go:embed openapi.json
var openAPIDoc []byte

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if c := s.cfg.Cluster; c != nil {
		// Degraded is still 200: the node serves its own sandboxes, and
		// a load balancer that dropped it would cut them off.
		if why := c.Degraded(); why != "" {
			writeJSON(w, http.StatusOK, map[string]string{"status": "degraded", "reason": "cluster: " + why})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *server) openAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDoc)
}

// infoResponse is the answer of GET /v1/info.
type infoResponse struct {
	Version        string                `json:"version"`
	Backends       []sandbox.BackendInfo `json:"backends"`
	DefaultBackend string                `json:"default_backend"`
	Capacity       sandbox.Capacity      `json:"capacity"`
	Pools          []sandbox.PoolInfo    `json:"pools"`
	// Cluster is this node's view of the cluster; absent on a single host.
	Cluster *clusterInfo `json:"cluster,omitempty"`
}

func (s *server) info(w http.ResponseWriter, r *http.Request) {
	b := s.mgr.Backends(r.Context())
	if b == nil {
		b = []sandbox.BackendInfo{}
	}
	writeJSON(w, http.StatusOK, infoResponse{
		Version:        s.cfg.Version,
		Backends:       b,
		DefaultBackend: s.mgr.DefaultBackend(),
		Capacity:       s.mgr.Capacity(),
		Pools:          s.mgr.Pools(),
		Cluster:        s.clusterInfo(),
	})
}
