package firecracker

import (
	"context"
	"fmt"
	"time"

	sdk "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
)

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
	DriveLimit        *models.RateLimiter
	TAP, MAC          string // "" TAP: no network interface
	RxLimit, TxLimit  *models.RateLimiter
	VsockPath         string
}

// newClient returns the SDK's typed API client for the socket at path.
// Its per-request timeout is the SDK's (500 ms unless the environment
// variable FIRECRACKER_GO_SDK_REQUEST_TIMEOUT_MILLISECONDS says otherwise).
func newClient(path string) *sdk.Client { return sdk.NewClient(path, nil, false) }

// configure has the conversation that turns a fresh Firecracker process
// into a running VM, in the order Firecracker needs: logger and metrics
// first (they can be set only once, before boot), then the machine, boot
// source, root drive, config drive, network interface, vsock, and
// InstanceStart.
func configure(ctx context.Context, c *sdk.Client, v vmConfig) error {
	steps := []struct {
		what string
		do   func() error
	}{
		{"PUT /logger", func() error {
			_, err := c.PutLogger(ctx, &models.Logger{LogPath: ptr(v.LogPath), Level: ptr(v.LogLevel), ShowLevel: ptr(true), ShowLogOrigin: ptr(false)})
			return err
		}},
		{"PUT /metrics", func() error {
			_, err := c.PutMetrics(ctx, &models.Metrics{MetricsPath: ptr(v.MetricsPath)})
			return err
		}},
		{"PUT /machine-config", func() error {
			_, err := c.PutMachineConfiguration(ctx, &models.MachineConfiguration{VcpuCount: ptr(v.VCPUs), MemSizeMib: ptr(v.MemoryMB), Smt: ptr(false)})
			return err
		}},
		{"PUT /boot-source", func() error {
			_, err := c.PutGuestBootSource(ctx, &models.BootSource{KernelImagePath: ptr(v.Kernel), InitrdPath: v.Initrd, BootArgs: v.BootArgs})
			return err
		}},
		{"PUT /drives/rootfs", func() error {
			_, err := c.PutGuestDriveByID(ctx, "rootfs", &models.Drive{
				DriveID: ptr("rootfs"), PathOnHost: ptr(v.Disk), IsRootDevice: ptr(true), IsReadOnly: ptr(false),
				RateLimiter: v.DriveLimit,
			})
			return err
		}},
		{"PUT /drives/config", func() error {
			_, err := c.PutGuestDriveByID(ctx, "config", &models.Drive{
				DriveID: ptr("config"), PathOnHost: ptr(v.ConfigDisk), IsRootDevice: ptr(false), IsReadOnly: ptr(true),
			})
			return err
		}},
		{"PUT /network-interfaces/eth0", func() error {
			if v.TAP == "" {
				return nil
			}
			_, err := c.PutGuestNetworkInterfaceByID(ctx, "eth0", &models.NetworkInterface{
				IfaceID: ptr("eth0"), HostDevName: ptr(v.TAP), GuestMac: v.MAC,
				RxRateLimiter: v.RxLimit, TxRateLimiter: v.TxLimit,
			})
			return err
		}},
		{"PUT /vsock", func() error {
			_, err := c.PutGuestVsock(ctx, &models.Vsock{GuestCid: ptr(int64(GuestCID)), UdsPath: ptr(v.VsockPath)})
			return err
		}},
		{"PUT /actions InstanceStart", func() error {
			_, err := c.CreateSyncAction(ctx, &models.InstanceActionInfo{ActionType: ptr(models.InstanceActionInfoActionTypeInstanceStart)})
			return err
		}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("firecracker API %s: %w", s.what, apiError(err))
		}
	}
	return nil
}

// apiError makes the SDK's error for a refused request show Firecracker's
// fault message.
func apiError(err error) error {
	type payloader interface{ GetPayload() *models.Error }
	if p, ok := err.(payloader); ok && p.GetPayload() != nil {
		return fmt.Errorf("%w: %s", err, p.GetPayload().FaultMessage)
	}
	return err
}

// waitAPI waits until Firecracker answers GET / on its socket, the process
// dies (dead is closed), or ctx ends.
func waitAPI(ctx context.Context, c *sdk.Client, dead <-chan struct{}) error {
	var last error
	for {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.GetInstanceInfo(tctx)
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
func sendCtrlAltDel(ctx context.Context, c *sdk.Client) error {
	_, err := c.CreateSyncAction(ctx, &models.InstanceActionInfo{ActionType: ptr(models.InstanceActionInfoActionTypeSendCtrlAltDel)})
	return apiError(err)
}
