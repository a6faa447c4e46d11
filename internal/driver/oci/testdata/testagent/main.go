// Command testagent stands in for cubicle-agent in the oci driver's tests: it
// serves plain HTTP on the unix socket given by --listen so the tests can
// check the socket path, the environment and the mounts of a box.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "", "unix socket path")
	flag.String("session", "", "session config (ignored)")
	flag.Parse()
	if os.Getenv("TESTAGENT_EXIT") != "" {
		fmt.Fprintln(os.Stderr, "testagent: exiting as asked")
		os.Exit(3)
	}
	// Like the real agent, SIGTERM is a shutdown: it writes "terminated"
	// to TESTAGENT_ON_TERM (when set) and exits, so a test can see that
	// a box was asked to stop before it was killed.
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	go func() {
		<-terms
		if p := os.Getenv("TESTAGENT_ON_TERM"); p != "" {
			_ = os.WriteFile(p, []byte("terminated"), 0o644)
			syscall.Sync()
		}
		os.Exit(0)
	}()
	os.Remove(*listen)
	l, err := net.Listen("unix", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testagent:", err)
		os.Exit(1)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s", os.Getenv("CUBICLE_AGENT_TOKEN"))
	})
	mux.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, os.Getenv(r.URL.Query().Get("k")))
	})
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		data, err := os.ReadFile(r.URL.Query().Get("p"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(data)
	})
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		if err := os.WriteFile(r.URL.Query().Get("p"), []byte("written"), 0o644); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("/exec", func(w http.ResponseWriter, r *http.Request) {
		script, _ := io.ReadAll(r.Body)
		out, err := exec.Command("/bin/sh", "-c", string(script)).CombinedOutput()
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "%v\n", err)
		}
		w.Write(out)
	})
	mux.HandleFunc("/closerange", func(w http.ResponseWriter, r *http.Request) {
		// GLib's "close every fd from 3 up", as CLOEXEC so that it
		// changes nothing for this Go program: prints the errno, 0 if
		// none. 436 is close_range on every Linux architecture.
		_, _, errno := syscall.Syscall(436, 3, 0xffffffff, 1<<2)
		fmt.Fprint(w, int(errno))
	})
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, r *http.Request) {
		h, _ := os.Hostname()
		fmt.Fprint(w, h)
	})
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "bye")
		go func() { time.Sleep(100 * time.Millisecond); os.Exit(0) }()
	})
	http.Serve(l, mux)
}
