package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Volume is a persistent disk of this API key: it outlives the sandboxes
// it is attached to, the reaper and daemon restarts, until DeleteVolume.
type Volume struct {
	Name   string `json:"name"`
	SizeMB int    `json:"size_mb"`
	// CreatedAt is when the volume was made.
	CreatedAt time.Time `json:"created_at"`
	// AttachedTo is the sandbox that holds the volume now ("" when free).
	AttachedTo string `json:"attached_to,omitempty"`
	// UsedMB is the host disk the volume takes now (its file is sparse).
	UsedMB int `json:"used_mb"`
}

var errEmptyVolume = errors.New("client: empty volume name")

func volumePath(name string) string { return "/v1/volumes/" + url.PathEscape(name) }

// CreateVolume makes an empty volume of sizeMB. Its file on the host is
// sparse, so a large size costs nothing until sandboxes write. A name in
// use yields an error for which IsConflict is true. It is not retried.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int) (Volume, error) {
	body, n, err := jsonBody(struct {
		Name   string `json:"name"`
		SizeMB int    `json:"size_mb"`
	}{name, sizeMB})
	if err != nil {
		return Volume{}, err
	}
	var v Volume
	err = c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/volumes", body: body, contentLen: n, contentType: "application/json"}, &v)
	return v, err
}

// ListVolumes returns this key's volumes, by name.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var out struct {
		Volumes []Volume `json:"volumes"`
	}
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/volumes", retry: true}, &out)
	return out.Volumes, err
}

// GetVolume returns one volume; an unknown name (or another key's volume)
// yields an error for which IsNotFound is true.
func (c *Client) GetVolume(ctx context.Context, name string) (Volume, error) {
	if name == "" {
		return Volume{}, errEmptyVolume
	}
	var v Volume
	err := c.doJSON(ctx, &request{method: http.MethodGet, path: volumePath(name), retry: true}, &v)
	return v, err
}

// DeleteVolume removes a volume and its data. A volume a sandbox holds
// yields an error for which IsConflict is true.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	if name == "" {
		return errEmptyVolume
	}
	return c.doJSON(ctx, &request{method: http.MethodDelete, path: volumePath(name), retry: true}, nil)
}
