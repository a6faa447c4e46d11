package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/client"
)

// probeMeta marks a sandbox a fault makes itself, each with a label of its
// own: faults overlap, so another fault's create may be in flight.
func (s *soak) probeMeta() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes++
	return map[string]string{"soak": "probe", "probe": strconv.Itoa(s.probes)}
}

// track adds a sandbox a fault made to those the audit accounts for.
func (s *soak) track(id string) { s.mu.Lock(); s.all[id] = true; s.mu.Unlock() }

// destroyProbes destroys sandboxes a fault made, retrying while cubicled
// restarts.
func (s *soak) destroyProbes(ids []string) {
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		for {
			err := s.c.Destroy(ctx, id)
			if err == nil || client.IsNotFound(err) {
				break
			}
			if client.ErrorCode(err) != "" || ctx.Err() != nil {
				s.problem("destroy probe %s: %v", id, err)
				break
			}
			sleep(ctx, time.Second)
		}
		cancel()
	}
}

// halfMade reports the probe sandbox of meta if it is neither running nor
// ended after its create returned: a create must be all or nothing.
func (s *soak) halfMade(ctx context.Context, what string, meta map[string]string) {
	sbs, err := s.c.List(ctx, client.ListOptions{Metadata: meta, State: "starting"})
	if err != nil {
		return // the daemon may be restarting; the final audit looks again
	}
	for _, sb := range sbs {
		s.problem("%s: sandbox %s still starting after its create returned", what, sb.ID)
	}
}

// dataDirFull fills the daemon's data directory (a filesystem the soak
// made for it) for a few seconds. A create meanwhile must fail with a
// clear error and leave nothing; running sandboxes go on.
func (s *soak) dataDirFull(ctx context.Context, _ string) error {
	end := s.faults.begin(faultDiskFull, "")
	path, err := fill(s.dataDir)
	defer func() {
		os.Remove(path)
		end(2 * time.Second) // a create that met the full disk may answer a moment later
	}()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	meta := s.probeMeta()
	t0 := time.Now()
	sb, err := s.c.Create(cctx, client.CreateRequest{Metadata: meta})
	cancel()
	switch why := s.faults.explainCreate(t0, time.Now(), err); {
	case err == nil:
		// Possible when a create found blocks another one freed.
		s.track(sb.ID)
		s.add("creates that succeeded on a full data dir", 1)
		s.destroyProbes([]string{sb.ID})
	case why == faultDiskFull:
		s.add("creates refused on a full data dir (503 unavailable, data directory is full)", 1)
	case why != "":
		s.add("creates refused: "+why, 1)
	default:
		s.problem("create on a full data dir: %v (want 503 unavailable saying the data directory is full)", err)
	}
	s.halfMade(ctx, "data dir full", meta)
	sleep(ctx, 5*time.Second) // the loops run on a full disk meanwhile
	return nil
}

// poolExhausted makes sandboxes until the network's addresses run out:
// the create that finds none must fail with capacity_exhausted and leave
// nothing; the loops' own creates meet the same refusal for a few
// seconds; then the extra sandboxes go and the loops have their addresses
// again. The extras are of s.probeBackend (runc by default): they only
// need to hold an address, and a gVisor desktop costs this 2-core machine
// about ten CPU-seconds to boot. A create refused for another reason (an
// overlapping fault: cubicled restarting, the disk full) is tried again.
func (s *soak) poolExhausted(ctx context.Context, _ string) error {
	var extra []string
	end := s.faults.begin(faultPoolEmpty, "")
	defer func() {
		s.destroyProbes(extra)
		end(2 * time.Second)
	}()
	for tries := 0; len(extra) <= s.poolSize; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		meta := s.probeMeta()
		sb, err := s.c.Create(cctx, client.CreateRequest{Backend: s.probeBackend, Metadata: meta})
		cancel()
		if err == nil {
			s.track(sb.ID)
			extra = append(extra, sb.ID)
			continue
		}
		s.halfMade(ctx, "address pool exhausted", meta)
		if client.ErrorCode(err) == "capacity_exhausted" && strings.Contains(err.Error(), "address") {
			s.add("creates refused for want of an address", 1)
			sleep(ctx, 5*time.Second) // the loops meet the empty pool meanwhile
			return nil
		}
		if tries++; tries == 5 {
			return fmt.Errorf("after %d extra sandboxes: %w", len(extra), err)
		}
		s.log("address pool fault: create after %d extra sandboxes: %v; again in 2 s", len(extra), err)
		sleep(ctx, 2*time.Second)
	}
	s.problem("address pool of %d never ran out", s.poolSize)
	return nil
}

// slowClients reads a screenshot at 5 KiB/s and stalls an upload after 4
// KiB, at once. The loops (other clients) must not notice; the daemon
// must drop the stalled upload (30 s without a byte) on its own.
func (s *soak) slowClients(ctx context.Context, id string) error {
	errc := make(chan error, 2)
	go func() { errc <- s.slowReader(ctx, id) }()
	go func() { errc <- s.stalledUpload(ctx, id) }()
	return errors.Join(<-errc, <-errc)
}

func (s *soak) rawRequest(ctx context.Context, head string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.d.Addr)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(conn, head+"Host: soak\r\nX-API-Key: "+s.d.APIKey+"\r\n\r\n"); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func (s *soak) slowReader(ctx context.Context, id string) error {
	conn, err := s.rawRequest(ctx, "GET /v1/sandboxes/"+id+"/screenshot HTTP/1.1\r\n")
	if err != nil {
		return err
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096) // so that the daemon feels the slowness
	}
	buf := make([]byte, 512)
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) && ctx.Err() == nil {
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := conn.Read(buf); err != nil {
			break // all read, or the daemon restarted
		}
		sleep(ctx, 100*time.Millisecond)
	}
	s.add("slow screenshot readers", 1)
	return nil
}

func (s *soak) stalledUpload(ctx context.Context, id string) error {
	conn, err := s.rawRequest(ctx, "PUT /v1/sandboxes/"+id+"/files?path=/tmp/soak-stalled HTTP/1.1\r\nContent-Length: 1048576\r\n")
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write(make([]byte, 4096)); err != nil {
		return err
	}
	t0 := time.Now()
	conn.SetReadDeadline(time.Now().Add(50 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		s.problem("a stalled upload to %s was still open after %v", id, time.Since(t0).Round(time.Second))
	case strings.Contains(line, " 200 "):
		s.problem("a stalled upload to %s succeeded: %q", id, line)
	default:
		s.add("stalled uploads cut by the daemon", 1)
		s.mu.Lock()
		s.lat["stalled upload cut after"] = append(s.lat["stalled upload cut after"], time.Since(t0))
		s.mu.Unlock()
	}
	return nil
}
