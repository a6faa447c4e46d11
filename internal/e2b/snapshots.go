package e2b

import (
	"errors"
	"net/http"
	"slices"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// E2B's snapshots are templates made from a running sandbox: POST
// /sandboxes/{id}/snapshots makes one, GET /snapshots lists them, and
// Sandbox.create(snapshotID) (POST /sandboxes with it as templateID)
// starts from one; it is deleted as a template (DELETE
// /templates/{templateID}). They are cubicle's snapshots of the calling
// key, by ID or name.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotInfoOf(s sandbox.Snapshot) snapshotInfo {
	names := []string{}
	if s.Name != "" {
		names = append(names, s.Name)
	}
	return snapshotInfo{SnapshotID: s.ID, Names: names}
}

// createSnapshot answers POST /sandboxes/{id}/snapshots ({name?}) with
// 201 and the new snapshot; the sandbox runs on.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, maxBodyBytes)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	var in struct {
		Name *string `json:"name"`
	}
	if err := decodeJSON(body, &in, true); err != nil {
		writeError(w, s.log, r, err)
		return
	}
	name := ""
	if in.Name != nil {
		name = *in.Name
	}
	if _, ok := s.templates[name]; ok {
		// Sandbox.create(name) would start the template, not the
		// snapshot.
		writeError(w, s.log, r, badRequestf("name %q is the name of a template; give the snapshot another", name))
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	snap, err := s.mgr.CreateSnapshot(r.Context(), sb.ID, s.keys.Owner(r), name, nil)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = notFound(sb.ID)
		}
		writeError(w, s.log, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotInfoOf(snap))
}

// listSnapshots answers GET /snapshots?sandboxID=&name=&limit=&nextToken=
// a page at a time, oldest first, X-Next-Token naming the next page.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	lq, err := parseListQuery(q)
	if err != nil {
		writeError(w, s.log, r, err)
		return
	}
	sandboxID, name := q.Get("sandboxID"), q.Get("name")
	snaps := s.mgr.ListSnapshots(r.Context(), s.keys.Owner(r), sandboxID)
	if name != "" {
		snaps = slices.DeleteFunc(snaps, func(sn sandbox.Snapshot) bool { return sn.Name != name })
	}
	// Pages are cut as sandbox listings are: by (creation, ID).
	pos := func(sn sandbox.Snapshot) sandbox.Sandbox { return sandbox.Sandbox{ID: sn.ID, CreatedAt: sn.CreatedAt} }
	if lq.after != nil {
		c := sandbox.Sandbox{ID: lq.after.id, CreatedAt: lq.after.created}
		snaps = slices.DeleteFunc(snaps, func(sn sandbox.Snapshot) bool { return compareListed(pos(sn), c, true) <= 0 })
	}
	if len(snaps) > lq.limit {
		snaps = snaps[:lq.limit]
		w.Header().Set("X-Next-Token", encodeCursor(pos(snaps[len(snaps)-1])))
	}
	out := make([]snapshotInfo, len(snaps))
	for i, sn := range snaps {
		out[i] = snapshotInfoOf(sn)
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate answers DELETE /templates/{templateID} for the key's
// snapshots: 204, or 404 (the SDK's deleteSnapshot then returns false).
// Image templates are the operator's, built on the host, and are not
// deleted through the API.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("templateID")
	if _, ok := s.templates[ref]; ok {
		writeError(w, s.log, r, statusErrorf(http.StatusForbidden, "template %q is an image of this host; only snapshots are deleted through the API", ref))
		return
	}
	if sandbox.CheckSnapshotRef("templateID", ref) != nil {
		writeError(w, s.log, r, statusErrorf(http.StatusNotFound, "template %q not found", truncate(ref, 64)))
		return
	}
	if err := s.mgr.DeleteSnapshot(r.Context(), s.keys.Owner(r), ref); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = statusErrorf(http.StatusNotFound, "template %q not found", ref)
		}
		writeError(w, s.log, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
