package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// The part of Firecracker's REST API the driver uses, as Go types. The
// names, JSON fields and which of them may be left out are those of the
// definitions in Firecracker's API description
// (src/firecracker/swagger/firecracker.yaml); apispec_test.go holds the
// facts of that file and checks every request the driver sends against
// them. Firecracker rejects unknown fields (its types are
// deny_unknown_fields), so nothing is sent that the description does not
// name.

// apiLogger is the Logger definition (PUT /logger).
type apiLogger struct {
	LogPath       string `json:"log_path"`
	Level         string `json:"level"`
	ShowLevel     bool   `json:"show_level"`
	ShowLogOrigin bool   `json:"show_log_origin"`
}

// apiMetrics is the Metrics definition (PUT /metrics).
type apiMetrics struct {
	MetricsPath string `json:"metrics_path"`
}

// apiMachineConfig is the MachineConfiguration definition (PUT
// /machine-config).
type apiMachineConfig struct {
	VCPUCount  int64 `json:"vcpu_count"`
	MemSizeMiB int64 `json:"mem_size_mib"`
	SMT        bool  `json:"smt"`
}

// apiBootSource is the BootSource definition (PUT /boot-source).
type apiBootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	InitrdPath      string `json:"initrd_path,omitempty"`
	BootArgs        string `json:"boot_args,omitempty"`
}

// apiDrive is the Drive definition (PUT /drives/{drive_id}), virtio-block
// form.
type apiDrive struct {
	DriveID      string          `json:"drive_id"`
	PathOnHost   string          `json:"path_on_host"`
	IsRootDevice bool            `json:"is_root_device"`
	IsReadOnly   bool            `json:"is_read_only"`
	RateLimiter  *apiRateLimiter `json:"rate_limiter,omitempty"`
}

// apiRateLimiter is the RateLimiter definition.
type apiRateLimiter struct {
	Bandwidth *apiTokenBucket `json:"bandwidth,omitempty"`
	Ops       *apiTokenBucket `json:"ops,omitempty"`
}

// apiTokenBucket is the TokenBucket definition.
type apiTokenBucket struct {
	Size         int64 `json:"size"`
	OneTimeBurst int64 `json:"one_time_burst,omitempty"`
	RefillTime   int64 `json:"refill_time"`
}

// apiNetworkInterface is the NetworkInterface definition (PUT
// /network-interfaces/{iface_id}).
type apiNetworkInterface struct {
	IfaceID       string          `json:"iface_id"`
	HostDevName   string          `json:"host_dev_name"`
	GuestMAC      string          `json:"guest_mac,omitempty"`
	RxRateLimiter *apiRateLimiter `json:"rx_rate_limiter,omitempty"`
	TxRateLimiter *apiRateLimiter `json:"tx_rate_limiter,omitempty"`
}

// apiVsock is the Vsock definition (PUT /vsock).
type apiVsock struct {
	GuestCID int64  `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

// apiAction is the InstanceActionInfo definition (PUT /actions).
type apiAction struct {
	ActionType string `json:"action_type"`
}

// Action types of apiAction.
const (
	actionInstanceStart  = "InstanceStart"
	actionSendCtrlAltDel = "SendCtrlAltDel"
)

// apiInstanceInfo is the InstanceInfo definition (GET /).
type apiInstanceInfo struct {
	AppName    string `json:"app_name"`
	ID         string `json:"id"`
	State      string `json:"state"`
	VMMVersion string `json:"vmm_version"`
}

// apiVM is the Vm definition (PATCH /vm): the microVM's run state.
type apiVM struct {
	State string `json:"state"` // vmPaused or vmResumed
}

// States of apiVM.
const (
	vmPaused  = "Paused"
	vmResumed = "Resumed"
)

// apiSnapshotCreate is the SnapshotCreateParams definition (PUT
// /snapshot/create). Paths are as the jailed Firecracker sees them.
type apiSnapshotCreate struct {
	SnapshotType string `json:"snapshot_type"` // "Full"
	SnapshotPath string `json:"snapshot_path"`
	MemFilePath  string `json:"mem_file_path"`
}

// apiSnapshotLoad is the SnapshotLoadParams definition (PUT
// /snapshot/load), with the memory backend form (mem_file_path is
// deprecated).
type apiSnapshotLoad struct {
	SnapshotPath        string           `json:"snapshot_path"`
	MemBackend          apiMemoryBackend `json:"mem_backend"`
	EnableDiffSnapshots bool             `json:"enable_diff_snapshots"`
	ResumeVM            bool             `json:"resume_vm"`
}

// apiMemoryBackend is the MemoryBackend definition.
type apiMemoryBackend struct {
	BackendType string `json:"backend_type"` // "File": the memory file is mapped private
	BackendPath string `json:"backend_path"`
}

// apiVMConfig is the FullVmConfiguration definition: the file
// `firecracker --no-api --config-file` boots from (the probe boot).
type apiVMConfig struct {
	BootSource    apiBootSource    `json:"boot-source"`
	Drives        []apiDrive       `json:"drives"` // required by Firecracker's parser, even empty
	MachineConfig apiMachineConfig `json:"machine-config"`
}

// apiClient is a client of one Firecracker's API socket. Every request is
// bounded by its context only: the driver decides how long Firecracker
// may take (an InstanceStart on a loaded host takes seconds), not a fixed
// per-request timeout.
type apiClient struct {
	socket string
	hc     *http.Client
}

// maxAPIReply bounds what is read of a reply; Firecracker's are small.
const maxAPIReply = 1 << 20

// newAPIClient returns a client of the API socket at path. It keeps no
// connection open between requests, so it needs no closing.
func newAPIClient(path string) *apiClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}
	return &apiClient{socket: path, hc: &http.Client{Transport: tr}}
}

// do sends one request with body (nil: none) and decodes a 2xx reply's
// body into out (nil: ignored). A refused request's error carries
// Firecracker's fault_message.
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		// A bytes.Reader gives the request a Content-Length: Firecracker's
		// HTTP server does not take chunked bodies.
		rd = bytes.NewReader(b)
	}
	// The host part is ignored: the transport dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s on %s: %w", method, path, c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIReply))
	if err != nil {
		return fmt.Errorf("%s %s: read reply: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			FaultMessage string `json:"fault_message"`
		}
		if json.Unmarshal(data, &e) == nil && e.FaultMessage != "" {
			return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, e.FaultMessage)
		}
		return fmt.Errorf("%s %s: %s: %q", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: reply: %w", method, path, err)
		}
	}
	return nil
}

func (c *apiClient) put(ctx context.Context, path string, body any) error {
	return c.do(ctx, http.MethodPut, path, body, nil)
}

// setVMState is PATCH /vm: pause or resume the vCPUs.
func (c *apiClient) setVMState(ctx context.Context, state string) error {
	return c.do(ctx, http.MethodPatch, "/vm", apiVM{State: state}, nil)
}

// instanceInfo is GET /.
func (c *apiClient) instanceInfo(ctx context.Context) (apiInstanceInfo, error) {
	var info apiInstanceInfo
	err := c.do(ctx, http.MethodGet, "/", nil, &info)
	return info, err
}

// vmConfig is everything the API conversation tells Firecracker. Paths are
// as the jailed Firecracker sees them (inside the chroot).
type vmConfig struct {
	LogPath, LogLevel string
	MetricsPath       string
	VCPUs, MemoryMB   int64
	Kernel, Initrd    string
	BootArgs          string
	Disk              string
	ConfigDisk        string // read-only drive with the vminit.Config
	Volumes           int    // volume drives (volumeName(i)), read-write
	DriveLimit        *apiRateLimiter
	TAP, MAC          string // "" TAP: no network interface
	RxLimit, TxLimit  *apiRateLimiter
	VsockPath         string
}

// configure has the conversation that turns a fresh Firecracker process
// into a running VM, in the order Firecracker needs: logger and metrics
// first (they can be set only once, before boot), then the machine, boot
// source, root drive, config drive, network interface, vsock, and
// InstanceStart.
func configure(ctx context.Context, c *apiClient, v vmConfig) error {
	type step struct {
		path string
		body any
	}
	steps := []step{
		{"/logger", apiLogger{LogPath: v.LogPath, Level: v.LogLevel, ShowLevel: true, ShowLogOrigin: false}},
		{"/metrics", apiMetrics{MetricsPath: v.MetricsPath}},
		{"/machine-config", apiMachineConfig{VCPUCount: v.VCPUs, MemSizeMiB: v.MemoryMB, SMT: false}},
		{"/boot-source", apiBootSource{KernelImagePath: v.Kernel, InitrdPath: v.Initrd, BootArgs: v.BootArgs}},
		{"/drives/rootfs", apiDrive{DriveID: "rootfs", PathOnHost: v.Disk, IsRootDevice: true, IsReadOnly: false, RateLimiter: v.DriveLimit}},
		{"/drives/config", apiDrive{DriveID: "config", PathOnHost: v.ConfigDisk, IsRootDevice: false, IsReadOnly: true}},
	}
	for _, dr := range volumeDrives(v.Volumes) {
		steps = append(steps, step{"/drives/" + dr.DriveID, dr})
	}
	if v.TAP != "" {
		steps = append(steps, step{"/network-interfaces/eth0", apiNetworkInterface{
			IfaceID: "eth0", HostDevName: v.TAP, GuestMAC: v.MAC, RxRateLimiter: v.RxLimit, TxRateLimiter: v.TxLimit,
		}})
	}
	steps = append(steps,
		step{"/vsock", apiVsock{GuestCID: GuestCID, UDSPath: v.VsockPath}},
		step{"/actions", apiAction{ActionType: actionInstanceStart}},
	)
	for _, s := range steps {
		if err := c.put(ctx, s.path, s.body); err != nil {
			return fmt.Errorf("firecracker API: %w", err)
		}
	}
	return nil
}

// waitAPI waits until Firecracker answers GET / on its socket, the process
// dies (dead is closed), or ctx ends.
func waitAPI(ctx context.Context, c *apiClient, dead <-chan struct{}) error {
	var last error
	for {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.instanceInfo(tctx)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("firecracker API not up: %w (last: %v)", ctx.Err(), last)
		case <-dead:
			return fmt.Errorf("firecracker exited before its API came up (last: %v)", last)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// sendCtrlAltDel asks the guest to shut down.
func sendCtrlAltDel(ctx context.Context, c *apiClient) error {
	return c.put(ctx, "/actions", apiAction{ActionType: actionSendCtrlAltDel})
}
