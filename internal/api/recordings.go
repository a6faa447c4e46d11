package api

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/recording"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// pathRecording returns the recording ID of the request's path, or a 404
// error when it cannot be one.
func pathRecording(r *http.Request) (string, error) {
	id := r.PathValue("recording")
	if !sandbox.ValidRecordingID(id) {
		return "", &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "recording not found"}
	}
	return id, nil
}

func (s *server) startRecording(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in sandbox.RecordingRequest
	if err := decodeOptionalJSON(w, r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, err := s.mgr.StartRecording(r.Context(), id, s.keys.Owner(r), in)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/recordings/"+rec.ID)
	writeJSON(w, http.StatusCreated, rec)
}

func (s *server) stopRecording(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rid, err := pathRecording(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := decodeOptionalEmpty(w, r, s.cfg.MaxBodyBytes); err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, err := s.mgr.StopRecording(r.Context(), s.keys.Owner(r), id, rid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// writeRecordings answers a list of recordings.
func writeRecordings(w http.ResponseWriter, list []sandbox.Recording) {
	if list == nil {
		list = []sandbox.Recording{}
	}
	writeJSON(w, http.StatusOK, struct {
		Recordings []sandbox.Recording `json:"recordings"`
	}{list})
}

func (s *server) listSandboxRecordings(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeRecordings(w, s.mgr.ListRecordings(r.Context(), s.keys.Owner(r), id))
}

func (s *server) listRecordings(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sandboxID := q.Get("sandbox_id")
	if len(q["sandbox_id"]) > 1 || (sandboxID != "" && !sandboxIDPattern.MatchString(sandboxID)) {
		s.writeError(w, r, invalidf("sandbox_id must be one sandbox id"))
		return
	}
	list := s.mgr.ListRecordings(r.Context(), s.keys.Owner(r), sandboxID)
	if more := itemsElsewhere[sandbox.Recording](s, r, r.URL.RequestURI(), "recordings"); len(more) > 0 {
		list = append(list, more...)
		slices.SortStableFunc(list, func(a, b sandbox.Recording) int {
			return cmp.Or(a.StartedAt.Compare(b.StartedAt), strings.Compare(a.ID, b.ID))
		})
	}
	writeRecordings(w, list)
}

func (s *server) getRecording(w http.ResponseWriter, r *http.Request) {
	rid, err := pathRecording(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, err := s.mgr.GetRecording(r.Context(), s.keys.Owner(r), rid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// recordingFile serves the video with Range support (http.ServeContent),
// so a browser's <video> can seek in it.
func (s *server) recordingFile(w http.ResponseWriter, r *http.Request) {
	rid, err := pathRecording(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, f, err := s.mgr.OpenRecording(r.Context(), s.keys.Owner(r), rid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", recording.ContentType(rec.Format))
	w.Header().Set("Content-Disposition", "attachment; filename="+strconv.Quote(rec.ID+"."+rec.Format))
	w.Header().Set("Cache-Control", "private, max-age=0")
	mod := rec.StartedAt
	if rec.StoppedAt != nil {
		mod = *rec.StoppedAt
	}
	http.ServeContent(w, r, "", mod, f)
}

func (s *server) deleteRecording(w http.ResponseWriter, r *http.Request) {
	rid, err := pathRecording(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.DeleteRecording(r.Context(), s.keys.Owner(r), rid); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
