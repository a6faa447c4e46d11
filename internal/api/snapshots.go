package api

import (
	"cmp"
	"net/http"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// createSnapshotRequest is the wire form of POST
// /v1/sandboxes/{id}/snapshots; every member is optional.
type createSnapshotRequest struct {
	Name     string            `json:"name"`
	Metadata map[string]string `json:"metadata"`
}

// pathSnapshot returns the snapshot ID or name of the request's path, or
// a 404 error when it cannot be one.
func pathSnapshot(r *http.Request) (string, error) {
	ref := r.PathValue("snapshot")
	if sandbox.CheckSnapshotRef("snapshot", ref) != nil {
		return "", &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "snapshot not found"}
	}
	return ref, nil
}

func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in createSnapshotRequest
	if err := decodeOptionalJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	snap, err := s.mgr.CreateSnapshot(r.Context(), id, s.keys.Owner(r), in.Name, in.Metadata)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/snapshots/"+snap.ID)
	writeJSON(w, http.StatusCreated, snap)
}

func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sandboxID := q.Get("sandbox_id")
	if len(q["sandbox_id"]) > 1 || (sandboxID != "" && !sandboxIDPattern.MatchString(sandboxID)) {
		s.writeError(w, r, invalidf("sandbox_id must be one sandbox id"))
		return
	}
	list := s.mgr.ListSnapshots(r.Context(), s.keys.Owner(r), sandboxID)
	if more := itemsElsewhere[sandbox.Snapshot](s, r, r.URL.RequestURI(), "snapshots"); len(more) > 0 {
		list = append(list, more...)
		slices.SortStableFunc(list, func(a, b sandbox.Snapshot) int {
			return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
		})
	}
	if list == nil {
		list = []sandbox.Snapshot{}
	}
	writeJSON(w, http.StatusOK, struct {
		Snapshots []sandbox.Snapshot `json:"snapshots"`
	}{list})
}

func (s *server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	ref, err := pathSnapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	snap, err := s.mgr.GetSnapshot(r.Context(), s.keys.Owner(r), ref)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	ref, err := pathSnapshot(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.DeleteSnapshot(r.Context(), s.keys.Owner(r), ref); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
