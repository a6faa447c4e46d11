// Command cubicle is the command-line client of the cubicle daemon: it
// creates and destroys sandboxes, drives their desktops, runs commands and
// copies files through the REST API (via package client, the public Go
// SDK), and builds and manages sandbox images locally (image subcommands,
// which need root and do not involve the daemon).
//
// It uses cobra rather than the standard flag package because the CLI is a
// tree of some twenty subcommands (with a nested "image" group) sharing
// global flags with environment defaults; cobra gives per-command help and
// usage, persistent flags, "--" handling for exec, and shell completion
// without hand-rolling a dispatcher. This file is only the entry point; each
// command group lives in its own file.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, newApp(os.Stdin, os.Stdout, os.Stderr, os.Getenv), os.Args[1:])
	stop()
	os.Exit(code)
}
