package main

import (
	"log/slog"
	"net"
	"os"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/session"
	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
	"github.com/mdlayher/vsock"
)

// vsockPort is where the agent listens on vsock (Firecracker's agent port).
const vsockPort = 1024

// runVM is the agent as PID 1 of a VM (see internal/agent/vminit): boot the
// guest, then serve exactly as in a container, but on the virtio-serial
// agent port, with the token and environment from the config disk. PID 1
// must never exit (the kernel would panic), so every way out powers off.
func runVM() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	cfg, err := vminit.Boot(log)
	if err != nil {
		log.Error("vm boot failed; powering off", "err", err)
		vminit.PowerOff()
	}
	os.Clearenv()
	for k, v := range cfg.Env {
		os.Setenv(k, v)
	}
	os.Setenv(agent.TokenEnv, cfg.Token)
	// QEMU gives the agent a virtio-serial port, Firecracker a vsock device
	// (its host side is the hybrid vsock unix socket, "CONNECT 1024").
	lns := []net.Listener{vminit.ListenPort(vminit.AgentPort, log)}
	if vl, err := vsock.Listen(vsockPort, nil); err == nil {
		lns = append(lns, vl)
	} else {
		log.Debug("no vsock listener", "err", err)
	}
	if err := run(log, "", "", session.DefaultPath, true, "root", false, lns); err != nil {
		log.Error("cubicle-agent", "err", err)
	}
	log.Info("powering off")
	vminit.PowerOff()
}
