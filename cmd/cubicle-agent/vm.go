package main

import (
	"log/slog"
	"net"
	"os"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/agent/session"
	"github.com/cubicle-dev/cubicle/internal/agent/vminit"
)

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
	ln := vminit.ListenPort(vminit.AgentPort, log)
	if err := run(log, "", "", session.DefaultPath, "root", false, []net.Listener{ln}); err != nil {
		log.Error("cubicle-agent", "err", err)
	}
	log.Info("powering off")
	vminit.PowerOff()
}
