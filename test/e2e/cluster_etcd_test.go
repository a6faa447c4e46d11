package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cubicle-dev/cubicle/internal/cluster"
	"github.com/cubicle-dev/cubicle/internal/cluster/etcdtest"
)

// probeSlack is how much longer than a node's lease the probe lease of
// unchangedAfterMemberStop lives. A new etcd leader extends every lease
// it takes over by its election timeout (etcdtest's is 500 ms), and etcd
// checks for expired leases every 500 ms and revokes one batch in
// parallel: 2 s puts the probe's expiry in a later batch than that of
// any node lease left unrenewed since the stop.
const probeSlack = 2 * time.Second

// unchangedAfterMemberStop is called right after one etcd member was
// stopped, with the endpoints of the members still up; it returns nil
// once the stop has had all the time it needs to change something and
// nothing changed, or what changed.
//
// What a stopped member would change is a node that cannot reach a
// quorum without it (its client stuck on that member's address): its
// keep-alive fails, so it says it is degraded (within a refresh plus
// etcd's call timeout, under 5 s for a 4 s lease), and its lease, no
// longer renewed, expires within one lease, which deletes its record
// (every node then shows its sandboxes lost). So, for longer than a
// lease: every node's /healthz is polled and must stay "ok", and etcd's
// node records are watched and none may be deleted or written under
// another lease. How long is decided by etcd itself, not by a sleep: a
// probe lease of leaseTTL+probeSlack, granted now (after any election
// the stop caused, since a grant needs a leader), is left to expire.
// Once etcd has deleted the probe's key, any node lease that had not
// been renewed since the stop would have been deleted before it; the
// records still under their leases then show that every node renewed
// through the remaining members.
func unchangedAfterMemberStop(ctx context.Context, endpoints, nodes []string, leaseTTL time.Duration, health func(node string) string) error {
	ctx, cancel := context.WithTimeout(ctx, leaseTTL+probeSlack+30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	nodePrefix := cluster.DefaultPrefix + "nodes/"
	leases := func() (map[string]clientv3.LeaseID, int64, error) {
		resp, err := cli.Get(ctx, nodePrefix, clientv3.WithPrefix())
		if err != nil {
			return nil, 0, fmt.Errorf("read the node records: %w", err)
		}
		out := map[string]clientv3.LeaseID{}
		for _, kv := range resp.Kvs {
			out[strings.TrimPrefix(string(kv.Key), nodePrefix)] = clientv3.LeaseID(kv.Lease)
		}
		return out, resp.Header.Revision, nil
	}
	before, rev, err := leases()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if before[n] == 0 {
			return fmt.Errorf("node %s has no record under a lease in etcd: %v", n, before)
		}
	}

	// /healthz of every node, until the probe has expired.
	var (
		mu       sync.Mutex
		degraded string
	)
	hctx, hcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for hctx.Err() == nil {
			for _, n := range nodes {
				if h := health(n); h != "ok" {
					mu.Lock()
					if degraded == "" {
						degraded = fmt.Sprintf("node %s says %q", n, h)
					}
					mu.Unlock()
					hcancel()
					return
				}
			}
			sleepCtx(hctx, 200*time.Millisecond)
		}
	}()
	defer func() { hcancel(); wg.Wait() }()

	g, err := cli.Grant(ctx, int64((leaseTTL+probeSlack)/time.Second))
	if err != nil {
		return fmt.Errorf("grant the probe lease: %w", err)
	}
	probe := fmt.Sprintf("/cubicle-e2e/probe-%x", int64(g.ID))
	if _, err := cli.Put(ctx, probe, "", clientv3.WithLease(g.ID)); err != nil {
		return fmt.Errorf("put the probe key: %w", err)
	}
	granted := time.Now()
	// From the revision the records were read at, and again from the
	// next one when a watch breaks (a leader lost, say): "/cubicle"
	// holds both cubicle's prefix and the probe's.
	next, watchErr := rev+1, error(nil)
	changed := func() error {
		for hctx.Err() == nil {
			wch := cli.Watch(clientv3.WithRequireLeader(hctx), "/cubicle", clientv3.WithPrefix(), clientv3.WithRev(next))
			for wr := range wch {
				if err := wr.Err(); err != nil {
					watchErr = err
					break
				}
				for _, ev := range wr.Events {
					next = ev.Kv.ModRevision + 1
					key := string(ev.Kv.Key)
					node := strings.TrimPrefix(key, nodePrefix)
					switch {
					case key == probe && ev.Type == clientv3.EventTypeDelete:
						return nil
					case !strings.HasPrefix(key, nodePrefix):
					case ev.Type == clientv3.EventTypeDelete:
						return fmt.Errorf("node %s's record was deleted: its lease expired", node)
					case clientv3.LeaseID(ev.Kv.Lease) != before[node]:
						return fmt.Errorf("node %s registered again under a new lease", node)
					}
				}
			}
			sleepCtx(hctx, 100*time.Millisecond)
		}
		return nil // the health poll's cancel, or the deadline: said below
	}()
	hcancel()
	wg.Wait()
	if degraded != "" {
		return fmt.Errorf("with one etcd member stopped, %s", degraded)
	}
	if changed != nil {
		return fmt.Errorf("with one etcd member stopped, %w", changed)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("the probe lease of %v granted after the member stopped had not expired %v later (last watch error: %v)", leaseTTL+probeSlack, time.Since(granted).Round(time.Second), watchErr)
	}
	after, _, err := leases()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if after[n] != before[n] {
			return fmt.Errorf("with one etcd member stopped, node %s's record went from lease %x to %x", n, before[n], after[n])
		}
	}
	return nil
}

// TestClusterMemberStopCheck shows that unchangedAfterMemberStop, which
// TestCluster relies on, sees what a stopped etcd member changes, without
// a desktop: on a three-member etcd, "nodes" keep a 2 s lease alive as
// cubicled does, through the members that stay up (nothing changes), or
// one only through the member that is stopped (its lease expires), or
// with a node saying it is degraded.
func TestClusterMemberStopCheck(t *testing.T) {
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name     string
		stuck    bool   // node y reaches etcd only through the stopped member
		degraded string // the node whose /healthz says degraded
		want     string // in the error; "" for none
	}{
		{name: "unchanged"},
		{name: "lease-expired", stuck: true, want: "node y's record was deleted"},
		{name: "degraded", degraded: "x", want: `node x says "degraded"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etcd := etcdtest.Start(t, 3)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			up := []string{etcd.Members[1].ClientURL, etcd.Members[2].ClientURL}
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			for _, name := range []string{"x", "y"} {
				eps := up
				if name == "y" && tc.stuck {
					eps = []string{etcd.Members[0].ClientURL}
				}
				cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
				if err != nil {
					t.Fatal(err)
				}
				defer cli.Close()
				g, err := cli.Grant(ctx, int64(ttl/time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := cli.Put(ctx, cluster.DefaultPrefix+"nodes/"+name, "{}", clientv3.WithLease(g.ID)); err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() { // a keep-alive per third of the lease, as cubicled's
					defer wg.Done()
					for ctx.Err() == nil {
						kctx, kcancel := context.WithTimeout(ctx, time.Second)
						cli.KeepAliveOnce(kctx, g.ID)
						kcancel()
						sleepCtx(ctx, ttl/3)
					}
				}()
			}
			etcd.Stop(0)
			began := time.Now()
			err := unchangedAfterMemberStop(ctx, up, []string{"x", "y"}, ttl, func(n string) string {
				if n == tc.degraded {
					return "degraded"
				}
				return "ok"
			})
			t.Logf("%v after the stop: %v", time.Since(began).Round(100*time.Millisecond), err)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no change", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
