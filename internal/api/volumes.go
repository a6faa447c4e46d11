package api

import (
	"net/http"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// createVolumeRequest is the wire form of POST /v1/volumes.
type createVolumeRequest struct {
	Name   string `json:"name"`
	SizeMB int    `json:"size_mb"`
}

// pathVolume returns the volume name of the request's path, or a 404
// error when it cannot be one.
func pathVolume(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if sandbox.CheckVolumeName("name", name) != nil {
		return "", &httpError{status: http.StatusNotFound, code: codeNotFound, msg: "volume not found"}
	}
	return name, nil
}

func (s *server) createVolume(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r, s.cfg.MaxBodyBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var in createVolumeRequest
	if err := decodeStrict(body, &in); err != nil {
		s.writeError(w, r, err)
		return
	}
	if in.SizeMB == 0 {
		s.writeError(w, r, invalidf("size_mb is required"))
		return
	}
	v, err := s.mgr.CreateVolume(r.Context(), s.keys.Owner(r), in.Name, in.SizeMB)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/volumes/"+v.Name)
	writeJSON(w, http.StatusCreated, v)
}

func (s *server) listVolumes(w http.ResponseWriter, r *http.Request) {
	list := s.mgr.ListVolumes(r.Context(), s.keys.Owner(r))
	if more := itemsElsewhere[sandbox.Volume](s, r, r.URL.RequestURI(), "volumes"); len(more) > 0 {
		list = append(list, more...)
		slices.SortStableFunc(list, func(a, b sandbox.Volume) int { return strings.Compare(a.Name, b.Name) })
	}
	if list == nil {
		list = []sandbox.Volume{}
	}
	writeJSON(w, http.StatusOK, struct {
		Volumes []sandbox.Volume `json:"volumes"`
	}{list})
}

func (s *server) getVolume(w http.ResponseWriter, r *http.Request) {
	name, err := pathVolume(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := s.mgr.GetVolume(r.Context(), s.keys.Owner(r), name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	name, err := pathVolume(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.DeleteVolume(r.Context(), s.keys.Owner(r), name); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
