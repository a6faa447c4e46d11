package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/cluster"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// Cluster is what the API needs of the cluster (internal/cluster) in
// cluster mode: where a sandbox is, where a new one goes, and the
// catalog to keep current.
type Cluster interface {
	Name() string
	Locate(ctx context.Context, id string, remote bool) (cluster.Location, bool, error)
	Place(backend string) ([]cluster.Node, error)
	Nodes() []cluster.Node
	Node(name string) (cluster.Node, bool)
	Degraded() string
	Draining() bool
	Put(ctx context.Context, e cluster.Entry) error
	Remove(ctx context.Context, id string) error
	// Sync writes this node's changed sandboxes to the catalog now.
	Sync(ctx context.Context) error
	Entries(keep func(cluster.Entry) bool) []cluster.Entry
	LeaseTTL() time.Duration
}

// forwardedHeader marks a request one node passes to another: the
// receiver serves it from its own sandboxes and never passes it on. It
// grants nothing: the forwarded request carries the client's own API key
// (or view token), which the receiving node checks again, so a client
// that sets the header itself only stops its request from being
// forwarded.
const forwardedHeader = "X-Cubicle-Forwarded-By"

// forwarded reports whether r came from another node.
func forwarded(r *http.Request) bool { return r.Header.Get(forwardedHeader) != "" }

// proxyBufferBytes is the largest request body a node reads whole
// before passing the request to another node.
const proxyBufferBytes = 1 << 20

// clusterTransport carries requests between nodes: many idle connections
// per node, since every proxied agent call reuses one.
var clusterTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	t.ResponseHeaderTimeout = 0 // exec streams and live views answer late
	t.Proxy = nil               // clients' keys go to the node, never through an HTTP_PROXY
	return t
}()

// clustered wraps a sandbox-scoped handler: in cluster mode a sandbox
// this node does not hold is served by its node, through this one.
func (s *server) clustered(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.Cluster == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.clusterRoute(w, r, r.PathValue("id"), nil) {
			h(w, r)
		}
	}
}

// clusterRoute answers a request about sandbox id when the sandbox is
// another node's: passed there, or answered lost, or 503 when the
// catalog cannot be read. It reports false for a request this node
// serves: its own sandbox, an unknown one (its handler's 404), or one
// forwarded here.
func (s *server) clusterRoute(w http.ResponseWriter, r *http.Request, id string, refuse func(http.ResponseWriter, *http.Request, error)) bool {
	if s.cfg.Cluster == nil || forwarded(r) || !sandboxID.MatchString(id) {
		return false
	}
	if _, err := s.mgr.Get(r.Context(), id); !errors.Is(err, errdefs.ErrNotFound) {
		return false // this node's own, served without asking etcd
	}
	// An id the watched catalog does not hold yet (made a moment ago) is
	// looked up in etcd for a key, and for requests without one (token
	// routes, checked by the sandbox's node) at a bounded rate, so that
	// strangers' random ids cannot load etcd.
	remote := s.keys.Authorized(r) || s.lookups.Allow()
	loc, found, err := s.cfg.Cluster.Locate(r.Context(), id, remote)
	if (err != nil || (found && !loc.Alive)) && !s.keys.Authorized(r) {
		// Only this node could answer, and only an API key may learn
		// that the sandbox exists: a view token's or envd token's route
		// (checked by the sandbox's own node) is answered as here.
		return false
	}
	switch {
	case err != nil && refuse != nil:
		refuse(w, r, errdefs.New(errdefs.ErrUnavailable, "sandbox %s is not on this node, and the cluster's catalog cannot be read: %v", id, err))
	case err != nil:
		s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
			msg: "sandbox " + id + " is not on this node, and the cluster's catalog cannot be read: " + err.Error()})
	case !found || loc.Node == s.cfg.Cluster.Name():
		return false
	case !loc.Alive && refuse != nil:
		refuse(w, r, errdefs.New(errdefs.ErrConflict, "sandbox %s is lost: %s", id, s.lostWhy(loc)))
	case !loc.Alive:
		s.lostSandbox(w, r, loc)
	default:
		s.proxy(w, r, loc.Node, loc.URL)
	}
	return true
}

// clusterMount routes a mount's request in cluster mode (E2B's control
// and data planes): a create is placed, a request about another node's
// sandbox is passed there. It reports whether it answered.
func (s *server) clusterMount(w http.ResponseWriter, r *http.Request, m *Mount) bool {
	if s.cfg.Cluster == nil {
		return false
	}
	creates := m.Creates != nil && m.Creates(r)
	if forwarded(r) {
		return creates && s.refuseDraining(w, r)
	}
	if creates {
		if !s.keys.Authorized(r) {
			return false // the mount refuses it in its own shape
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxBodyBytes+1))
		// Whatever was read goes back in front of the rest.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		if err != nil || int64(len(body)) > s.cfg.MaxBodyBytes {
			return false // the handler meets the same body, and refuses it
		}
		if m.Placeable != nil && !m.Placeable(body) {
			return false // made here, where its snapshot or volumes are
		}
		return s.placeCreate(w, r, "", body, false)
	}
	if m.Sandbox != nil {
		if id := m.Sandbox(r); id != "" {
			return s.clusterRoute(w, r, id, m.Refuse)
		}
	}
	return false
}

// clusterMountDone brings the catalog up to date at once after a mount
// created or deleted a sandbox here (the native API writes its entries
// itself; a mount's handler knows nothing of the cluster).
func (s *server) clusterMountDone(r *http.Request, m *Mount, status int) {
	// The control plane's only (the mount that places creates), and
	// only what it answered with success: a data-plane request, or a
	// refused one, changes no sandbox.
	if s.cfg.Cluster == nil || m.Creates == nil || status < 200 || status >= 300 {
		return
	}
	if m.Creates(r) || (r.Method == http.MethodDelete && m.Sandbox != nil && m.Sandbox(r) != "") {
		if err := s.cfg.Cluster.Sync(r.Context()); err != nil {
			s.log.Warn("cluster: catalog sync after a create; the next reconcile does it", "err", err)
		}
	}
}

// lostSandbox answers for a sandbox whose node is not a member now.
func (s *server) lostSandbox(w http.ResponseWriter, r *http.Request, loc cluster.Location) {
	why := s.lostWhy(loc)
	if r.Method == http.MethodGet && r.Pattern == "GET /v1/sandboxes/{id}" {
		writeJSON(w, http.StatusOK, lostView(loc.Entry, why))
		return
	}
	s.writeError(w, r, &httpError{status: http.StatusConflict, code: codeConflict, msg: "sandbox " + loc.ID + " is lost: " + why})
}

// lostWhy says why a sandbox is lost.
func (s *server) lostWhy(loc cluster.Location) string {
	return fmt.Sprintf("node %s, which holds this sandbox, has not renewed its cluster membership within %s; the sandbox is lost until the node is back", loc.Node, s.cfg.Cluster.LeaseTTL())
}

// lostView is the catalog's copy of a sandbox, in state lost.
func lostView(e cluster.Entry, why string) sandbox.Sandbox {
	var sb sandbox.Sandbox
	if len(e.Sandbox) == 0 || json.Unmarshal(e.Sandbox, &sb) != nil {
		sb = sandbox.Sandbox{ID: e.ID, Backend: e.Backend, CreatedAt: e.Created, ExpiresAt: e.Expires}
	}
	sb.State = sandbox.StateLost
	sb.Node = e.Node
	sb.Error = why
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	return sb
}

// proxy passes r to node's API at base, streaming both ways (exec
// output, file bodies, WebSocket upgrades for the live view and CDP).
func (s *server) proxy(w http.ResponseWriter, r *http.Request, node, base string) {
	target, err := url.Parse(base)
	if err != nil || target.Host == "" {
		s.writeError(w, r, &httpError{status: http.StatusBadGateway, code: codeUnavailable,
			msg: fmt.Sprintf("node %s has no usable address (%q)", node, base)})
		return
	}
	s.metrics.ClusterProxied.WithLabelValues(node).Inc()
	// A small body is read whole before it is passed on. The node's
	// answer may start before the proxy has read the body to its end (a
	// Connect stream: E2B's commands, the SDK's VNC start); Go's HTTP/1
	// server then drains and closes the rest under the transport, and the
	// stream is cut ("[unknown] terminated" in E2B's SDK, seen in CI).
	// Full duplex would avoid that but leaves a body the node refused
	// unread on the client's connection. Larger bodies (file uploads)
	// are answered only once the node has read them.
	if r.ContentLength > 0 && r.ContentLength <= proxyBufferBytes {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			s.writeError(w, r, &httpError{status: http.StatusBadRequest, code: codeInvalid,
				msg: "reading the request body: " + err.Error()})
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The client's Host goes on: the node routes E2B's data
			// plane by it, checks a live view's Origin against it, and
			// makes links with it.
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(forwardedHeader, s.cfg.Cluster.Name())
		},
		Transport:     clusterTransport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			s.log.Warn("cluster: the sandbox's node did not answer", "node", node, "err", err)
			msg := "the node that holds this sandbox did not answer; retry"
			if s.keys.Authorized(r) {
				msg = fmt.Sprintf("node %s, which holds this sandbox, did not answer (%v); retry", node, err)
			}
			s.writeError(w, r, &httpError{status: http.StatusBadGateway, code: codeUnavailable, msg: msg})
		},
	}
	rp.ServeHTTP(w, r)
}

// clusterCreate places a create in cluster mode: on this node, or on
// the best of K nodes with room, through this one. It reports whether
// it answered (false: create here).
func (s *server) clusterCreate(w http.ResponseWriter, r *http.Request, req sandbox.CreateRequest, body []byte) bool {
	c := s.cfg.Cluster
	if c == nil {
		return false
	}
	if forwarded(r) {
		return s.refuseDraining(w, r)
	}
	if len(req.Volumes) > 0 || req.FromSnapshot != "" {
		// Volumes and snapshots stay on the node that has them: such a
		// create is made there.
		return s.createWhereHeld(w, r, req, body)
	}
	backend := req.Backend
	if backend == "auto" {
		backend = "" // each node resolves auto itself
	}
	return s.placeCreate(w, r, backend, body, true)
}

// createWhereHeld passes a create that names a snapshot or volumes to
// the node that holds them (the snapshot, else the first volume), and
// reports whether it did; false when this node holds them, or no node
// does (the handler then answers what is missing).
func (s *server) createWhereHeld(w http.ResponseWriter, r *http.Request, req sandbox.CreateRequest, body []byte) bool {
	owner := s.keys.Owner(r)
	var path string
	if req.FromSnapshot != "" {
		if sandbox.CheckSnapshotRef("from_snapshot", req.FromSnapshot) != nil {
			return false
		}
		if _, err := s.mgr.GetSnapshot(r.Context(), owner, req.FromSnapshot); !errors.Is(err, errdefs.ErrNotFound) {
			return false
		}
		path = "/v1/snapshots/" + url.PathEscape(req.FromSnapshot)
	} else {
		name := req.Volumes[0].Name
		if sandbox.CheckVolumeName("name", name) != nil {
			return false
		}
		if _, err := s.mgr.GetVolume(r.Context(), owner, name); !errors.Is(err, errdefs.ErrNotFound) {
			return false
		}
		path = "/v1/volumes/" + url.PathEscape(name)
	}
	n, ok, err := s.findItem(r, path)
	switch {
	case ok:
		return s.forwardCreate(w, r, n, body, true)
	case err != nil:
		s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable, msg: "the snapshot or volume is " + err.Error()})
		return true
	}
	return false
}

// refuseDraining answers 503 to a create passed here while this node
// drains (the sender tries its next candidate), and reports whether it
// did: a client that sends the forwarded header itself does not get
// past a drain either.
func (s *server) refuseDraining(w http.ResponseWriter, r *http.Request) bool {
	if !s.cfg.Cluster.Draining() {
		return false
	}
	s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
		msg: "node " + s.cfg.Cluster.Name() + " is draining and takes no new sandbox"})
	return true
}

// placeCreate places a create of backend ("" for any) whose body is
// body: it reports false when this node is to create it, and answers
// otherwise (forwarded to another node, or refused). With no node
// fitting, native says whether to refuse here in the native shape or to
// leave the create to this node's handler (a mount's, which refuses in
// its own shape when this node is full too).
func (s *server) placeCreate(w http.ResponseWriter, r *http.Request, backend string, body []byte, native bool) bool {
	c := s.cfg.Cluster
	nodes, err := c.Place(backend)
	if err != nil {
		// Without etcd this node still creates on itself: only placing
		// elsewhere needs the cluster.
		if c.Draining() {
			s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
				msg: "this node is draining and the cluster is unavailable to place the sandbox elsewhere: " + err.Error()})
			return true
		}
		return false
	}
	if len(nodes) == 0 {
		if c.Draining() {
			s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable,
				msg: "this node is draining, and no other node of the cluster has room for the sandbox"})
			return true
		}
		if !native {
			return false
		}
		what := "a sandbox"
		if backend != "" {
			what = "a " + backend + " sandbox"
		}
		s.writeError(w, r, errdefs.New(errdefs.ErrCapacity, "no node of the cluster has room for %s", what))
		return true
	}
	for i, n := range nodes {
		if n.Name == c.Name() {
			return false
		}
		last := i == len(nodes)-1
		if s.forwardCreate(w, r, n, body, last) {
			return true
		}
	}
	return true
}

// forwardCreate sends a create to node n. A refusal for capacity (the
// node filled up since its record) is not answered unless last, so that
// the next candidate is tried; it reports whether it answered.
func (s *server) forwardCreate(w http.ResponseWriter, r *http.Request, n cluster.Node, body []byte, last bool) bool {
	u := strings.TrimSuffix(n.URL, "/") + r.URL.RequestURI()
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		s.writeError(w, r, err)
		return true
	}
	for _, h := range []string{"Authorization", "X-API-Key", "Content-Type", "Idempotency-Key"} {
		if v := r.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
	out.Header.Set(forwardedHeader, s.cfg.Cluster.Name())
	s.metrics.ClusterProxied.WithLabelValues(n.Name).Inc()
	resp, err := clusterTransport.RoundTrip(out)
	if err != nil {
		if !last {
			s.log.Warn("cluster: forward create failed; trying the next node", "node", n.Name, "err", err)
			return false
		}
		s.writeError(w, r, &httpError{status: http.StatusBadGateway, code: codeUnavailable,
			msg: fmt.Sprintf("node %s did not answer the create: %v", n.Name, err)})
		return true
	}
	defer resp.Body.Close()
	// 503: the node is full or draining; 429 is how E2B's API says full.
	if (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests) && !last {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return false
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
	return true
}

// clusterList adds the sandboxes of the other nodes to a list: each live
// node is asked (in parallel, with the client's own key), and a node that
// is gone or does not answer in time contributes its catalog entries, as
// lost.
func (s *server) clusterList(r *http.Request, local []sandbox.Sandbox, f sandbox.Filter) []sandbox.Sandbox {
	c := s.cfg.Cluster
	for i := range local {
		local[i].Node = c.Name()
	}
	if forwarded(r) {
		return local
	}
	nodes := c.Nodes()
	alive := map[string]bool{c.Name(): true}
	var (
		mu  sync.Mutex
		out = local
		wg  sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	for _, n := range nodes {
		if n.Name == c.Name() {
			continue
		}
		wg.Add(1)
		go func(n cluster.Node) {
			defer wg.Done()
			list, err := s.listNode(ctx, r, n, r.URL.RequestURI())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.log.Warn("cluster: list a node's sandboxes", "node", n.Name, "err", err)
				return
			}
			alive[n.Name] = true
			out = append(out, list...)
		}(n)
	}
	wg.Wait()
	if f.State != "" && f.State != sandbox.StateLost {
		return out
	}
	for _, e := range c.Entries(func(e cluster.Entry) bool { return !alive[e.Node] }) {
		if _, ok := c.Node(e.Node); ok {
			// Live, but it did not answer in time: its entries are
			// stale, not lost.
			continue
		}
		sb := lostView(e, "node "+e.Node+" is not a member of the cluster now")
		match := f.State == "" || f.State == sandbox.StateLost
		for k, v := range f.Metadata {
			if sb.Metadata[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	return out
}

// Elsewhere returns the sandboxes of the cluster's other live nodes, as
// each answers the native list with the client's own key (in parallel,
// within 5 s; a node that does not answer is left out): E2B's lists span
// the cluster with it. Nil outside a cluster and for a forwarded request.
func (h *Server) Elsewhere(r *http.Request) []sandbox.Sandbox {
	s := h.s
	c := s.cfg.Cluster
	if c == nil || forwarded(r) {
		return nil
	}
	var (
		mu  sync.Mutex
		out []sandbox.Sandbox
		wg  sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	for _, n := range c.Nodes() {
		if n.Name == c.Name() {
			continue
		}
		wg.Add(1)
		go func(n cluster.Node) {
			defer wg.Done()
			list, err := s.listNode(ctx, r, n, "/v1/sandboxes")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				s.log.Warn("cluster: list a node's sandboxes", "node", n.Name, "err", err)
				return
			}
			out = append(out, list...)
		}(n)
	}
	wg.Wait()
	return out
}

// listNode asks node n for its native list at uri, with r's key.
func (s *server) listNode(ctx context.Context, r *http.Request, n cluster.Node, uri string) ([]sandbox.Sandbox, error) {
	u := strings.TrimSuffix(n.URL, "/") + uri
	out, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Authorization", "X-API-Key"} {
		if v := r.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
	out.Header.Set(forwardedHeader, s.cfg.Cluster.Name())
	resp, err := clusterTransport.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var body struct {
		Sandboxes []sandbox.Sandbox `json:"sandboxes"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, err
	}
	for i := range body.Sandboxes {
		if body.Sandboxes[i].Node == "" {
			body.Sandboxes[i].Node = n.Name
		}
	}
	return body.Sandboxes, nil
}

// item is what a volume, snapshot or recording route is about: the path
// that reads it on any node (its GET), and whether this node holds it.
type item func(r *http.Request) (path string, here bool)

// itemOf returns the item of a volume, snapshot or recording route, nil
// for any other.
func (s *server) itemOf(pattern string) item {
	if s.cfg.Cluster == nil {
		return nil
	}
	_, path, _ := strings.Cut(pattern, " ")
	switch {
	case strings.HasPrefix(path, "/v1/volumes/{name}"):
		return func(r *http.Request) (string, bool) {
			name, err := pathVolume(r)
			if err != nil {
				return "", true // the handler refuses it
			}
			_, err = s.mgr.GetVolume(r.Context(), s.keys.Owner(r), name)
			return "/v1/volumes/" + url.PathEscape(name), !errors.Is(err, errdefs.ErrNotFound)
		}
	case strings.HasPrefix(path, "/v1/snapshots/{snapshot}"):
		return func(r *http.Request) (string, bool) {
			ref, err := pathSnapshot(r)
			if err != nil {
				return "", true
			}
			_, err = s.mgr.GetSnapshot(r.Context(), s.keys.Owner(r), ref)
			return "/v1/snapshots/" + url.PathEscape(ref), !errors.Is(err, errdefs.ErrNotFound)
		}
	case strings.HasPrefix(path, "/v1/recordings/{recording}"):
		return func(r *http.Request) (string, bool) {
			id, err := pathRecording(r)
			if err != nil {
				return "", true
			}
			_, err = s.mgr.GetRecording(r.Context(), s.keys.Owner(r), id)
			return "/v1/recordings/" + url.PathEscape(id), !errors.Is(err, errdefs.ErrNotFound)
		}
	}
	return nil
}

// clusteredItem passes a request about a volume, snapshot or recording
// this node does not hold to the node that does. Those stay on the node
// where they were made (their files are there), and the catalog does not
// hold them, so the other live nodes are asked, in parallel, with the
// client's own key; a key's items are few and such calls rare next to a
// sandbox's. Found nowhere, the handler answers its 404.
func (s *server) clusteredItem(h http.HandlerFunc, it item) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if forwarded(r) || !s.keys.Authorized(r) {
			h(w, r)
			return
		}
		path, here := it(r)
		if here {
			h(w, r)
			return
		}
		n, ok, err := s.findItem(r, path)
		switch {
		case ok:
			s.proxy(w, r, n.Name, n.URL)
		case err != nil:
			s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, code: codeUnavailable, msg: err.Error()})
		default:
			h(w, r)
		}
	}
}

// findItem asks the other live nodes for path (a GET, with r's key) and
// returns the first that has it. When none has it and some did not
// answer (or failed), it cannot say the item does not exist: the error
// says which nodes it could not ask.
func (s *server) findItem(r *http.Request, path string) (cluster.Node, bool, error) {
	c := s.cfg.Cluster
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	found := make(chan cluster.Node, 1)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		unsure []string
	)
	for _, n := range c.Nodes() {
		if n.Name == c.Name() {
			continue
		}
		wg.Add(1)
		go func(n cluster.Node) {
			defer wg.Done()
			resp, err := s.askNode(ctx, r, n, path)
			if err == nil {
				resp.Body.Close()
			}
			switch {
			case err == nil && resp.StatusCode == http.StatusOK:
				select {
				case found <- n:
					cancel() // the others need not finish
				default:
				}
			case err == nil && resp.StatusCode == http.StatusNotFound:
			default:
				// (Or cut short because another had it: then
				// unsure is not read.)
				mu.Lock()
				unsure = append(unsure, n.Name)
				mu.Unlock()
			}
		}(n)
	}
	wg.Wait()
	select {
	case n := <-found:
		return n, true, nil
	default:
	}
	if len(unsure) > 0 {
		sort.Strings(unsure)
		return cluster.Node{}, false, fmt.Errorf("not on this node, and node(s) %s did not answer whether they hold it; retry", strings.Join(unsure, ", "))
	}
	return cluster.Node{}, false, nil
}

// askNode GETs uri from node n with r's key, marked as forwarded (n
// answers for itself only).
func (s *server) askNode(ctx context.Context, r *http.Request, n cluster.Node, uri string) (*http.Response, error) {
	out, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(n.URL, "/")+uri, nil)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Authorization", "X-API-Key"} {
		if v := r.Header.Values(h); len(v) > 0 {
			out.Header[h] = v
		}
	}
	out.Header.Set(forwardedHeader, s.cfg.Cluster.Name())
	return clusterTransport.RoundTrip(out)
}

// itemsElsewhere returns the volumes, snapshots or recordings (field of
// the list's answer) that the other live nodes list at uri for r's key,
// for a list to span the cluster. A node that does not answer within
// 5 s is left out; nil outside a cluster or for a forwarded request.
func itemsElsewhere[T any](s *server, r *http.Request, uri, field string) []T {
	c := s.cfg.Cluster
	if c == nil || forwarded(r) {
		return nil
	}
	var (
		mu  sync.Mutex
		out []T
		wg  sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	for _, n := range c.Nodes() {
		if n.Name == c.Name() {
			continue
		}
		wg.Add(1)
		go func(n cluster.Node) {
			defer wg.Done()
			resp, err := s.askNode(ctx, r, n, uri)
			if err != nil {
				s.log.Warn("cluster: list a node's "+field, "node", n.Name, "err", err)
				return
			}
			defer resp.Body.Close()
			var body map[string][]T
			if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body) != nil {
				s.log.Warn("cluster: list a node's "+field, "node", n.Name, "status", resp.StatusCode)
				return
			}
			mu.Lock()
			out = append(out, body[field]...)
			mu.Unlock()
		}(n)
	}
	wg.Wait()
	return out
}

// catalogPut records a sandbox this node now holds; a failure is left to
// the next reconcile.
func (s *server) catalogPut(ctx context.Context, sb sandbox.Sandbox, owner string) {
	if s.cfg.Cluster == nil {
		return
	}
	e, err := CatalogEntry(sb, owner)
	if err == nil {
		err = s.cfg.Cluster.Put(ctx, e)
	}
	if err != nil {
		s.log.Warn("cluster: catalog put; the next reconcile writes it", "sandbox", sb.ID, "err", err)
	}
}

// catalogRemove forgets a sandbox this node destroyed.
func (s *server) catalogRemove(ctx context.Context, id string) {
	if s.cfg.Cluster == nil {
		return
	}
	if err := s.cfg.Cluster.Remove(ctx, id); err != nil {
		s.log.Warn("cluster: catalog remove; the next reconcile does it", "sandbox", id, "err", err)
	}
}

// CatalogEntry is sandbox sb of owner as the cluster's catalog holds it.
func CatalogEntry(sb sandbox.Sandbox, owner string) (cluster.Entry, error) {
	// Without what changes on every call (last activity): an entry is
	// written when the sandbox changes, not each time an agent acts.
	sb.LastActiveAt = time.Time{}
	sb.Node = ""
	raw, err := json.Marshal(sb)
	if err != nil {
		return cluster.Entry{}, err
	}
	return cluster.Entry{ID: sb.ID, State: string(sb.State), Owner: owner, Backend: sb.Backend,
		Created: sb.CreatedAt, Expires: sb.ExpiresAt, Sandbox: raw}, nil
}

// clusterInfo is the cluster part of GET /v1/info.
type clusterInfo struct {
	Node     string         `json:"node"`
	Degraded string         `json:"degraded,omitempty"`
	Draining bool           `json:"draining"`
	Nodes    []cluster.Node `json:"nodes"`
}

func (s *server) clusterInfo() *clusterInfo {
	c := s.cfg.Cluster
	if c == nil {
		return nil
	}
	nodes := c.Nodes()
	if nodes == nil {
		nodes = []cluster.Node{}
	}
	return &clusterInfo{Node: c.Name(), Degraded: c.Degraded(), Draining: c.Draining(), Nodes: nodes}
}
