package sandbox

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cubicle-dev/cubicle/internal/driver"
)

// The store is bbolt: a single-file, embedded, transactional key/value store
// with no cgo and no server, which is all the manager needs to survive a
// restart (a handful of records, written on state changes only).

var (
	bucketSandboxes = []byte("sandboxes")
	bucketVolumes   = []byte("volumes")
	bucketSnapshots = []byte("snapshots")
	// bucketRecordings holds recordings (recording.go); the API view
	// is stored whole, as it has nothing the store must hide.
	bucketRecordings = []byte("recordings")
)

// store persists records in a bbolt file under the data dir.
type store struct {
	db *bolt.DB
}

func openStore(dataDir string) (*store, error) {
	path := filepath.Join(dataDir, "cubicle.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w (is another cubicled running?)", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketVolumes, bucketSnapshots, bucketRecordings} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("init store: %w", err)
	}
	return &store{db: db}, nil
}

func (s *store) close() error { return s.db.Close() }

func (s *store) put(r *record) error {
	b, err := encodeRecord(r)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", r.Sandbox.ID, err)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(r.Sandbox.ID), b)
	})
}

func (s *store) delete(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	})
}

func (s *store) all() ([]*record, error) {
	var out []*record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("decode record %s: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// storedVolume is a volume as the store keeps it.
type storedVolume struct {
	Version    int       `json:"v"`
	Owner      string    `json:"owner"`
	Name       string    `json:"name"`
	SizeMB     int       `json:"size_mb"`
	CreatedAt  time.Time `json:"created"`
	AttachedTo string    `json:"attached_to,omitempty"`
}

const volumeVersion = 1

func (s *store) putVolume(v *volume) error {
	b, err := json.Marshal(storedVolume{Version: volumeVersion, Owner: v.Owner, Name: v.Name, SizeMB: v.SizeMB, CreatedAt: v.CreatedAt, AttachedTo: v.AttachedTo})
	if err != nil {
		return fmt.Errorf("encode volume %s: %w", v.Name, err)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Put([]byte(volumeKey(v.Owner, v.Name)), b)
	})
}

func (s *store) deleteVolume(owner, name string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Delete([]byte(volumeKey(owner, name)))
	})
}

func (s *store) allVolumes() ([]*volume, error) {
	var out []*volume
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).ForEach(func(k, b []byte) error {
			var sv storedVolume
			if err := json.Unmarshal(b, &sv); err != nil {
				return fmt.Errorf("decode volume %q: %w", k, err)
			}
			if sv.Version != volumeVersion {
				return fmt.Errorf("volume %q: record version %d: this cubicled reads version %d (was the data directory used by a newer cubicled?)", k, sv.Version, volumeVersion)
			}
			out = append(out, &volume{Owner: sv.Owner, Name: sv.Name, SizeMB: sv.SizeMB, CreatedAt: sv.CreatedAt, AttachedTo: sv.AttachedTo})
			return nil
		})
	})
	return out, err
}

// storedSnapshot is a snapshot as the store keeps it. Its JSON names are
// the store's own, as storedRecord's are.
type storedSnapshot struct {
	Version   int               `json:"v"`
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Owner     string            `json:"owner"`
	SandboxID string            `json:"sandbox"`
	Template  string            `json:"template"`
	Backend   string            `json:"backend"`
	Isolation string            `json:"isolation"`
	Width     int               `json:"width"`
	Height    int               `json:"height"`
	Bytes     int64             `json:"bytes"`
	CreatedAt time.Time         `json:"created"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Token     string            `json:"token"`
	IP        string            `json:"ip,omitempty"`
	Desktop   *bool             `json:"desktop,omitempty"`
	Request   storedRequest     `json:"request"`
	Driver    storedDriver      `json:"driver"`
}

const snapshotVersion = 1

func (s *store) putSnapshot(sn *snap) error {
	b, err := json.Marshal(storedSnapshot{
		Version: snapshotVersion, ID: sn.ID, Name: sn.Name, Owner: sn.Owner, SandboxID: sn.SandboxID,
		Template: sn.Template, Backend: sn.Backend, Isolation: sn.Isolation,
		Width: sn.Resolution.Width, Height: sn.Resolution.Height, Bytes: sn.SizeBytes, CreatedAt: sn.CreatedAt,
		Metadata: sn.Metadata, Token: sn.Token, IP: sn.IP, Desktop: sn.Desktop, Request: storeRequest(sn.Request),
		Driver: storedDriver{Version: sn.Driver.Version, Name: sn.Driver.Driver, Data: sn.Driver.Data},
	})
	if err != nil {
		return fmt.Errorf("encode snapshot %s: %w", sn.ID, err)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).Put([]byte(sn.ID), b)
	})
}

func (s *store) deleteSnapshot(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).Delete([]byte(id))
	})
}

func (s *store) allSnapshots() ([]*snap, error) {
	var out []*snap
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, b []byte) error {
			sn, err := decodeSnapshot(b)
			if err != nil {
				return fmt.Errorf("snapshot %q: %w", k, err)
			}
			out = append(out, sn)
			return nil
		})
	})
	return out, err
}

// decodeSnapshot reads a stored snapshot; one of a newer version is an
// error, as for sandbox records.
func decodeSnapshot(b []byte) (*snap, error) {
	var ss storedSnapshot
	if err := json.Unmarshal(b, &ss); err != nil {
		return nil, err
	}
	if ss.Version != snapshotVersion {
		return nil, fmt.Errorf("record version %d: this cubicled reads version %d (was the data directory used by a newer cubicled?)", ss.Version, snapshotVersion)
	}
	q := ss.Request.request()
	return &snap{
		Snapshot: Snapshot{
			ID: ss.ID, Name: ss.Name, SandboxID: ss.SandboxID, Template: ss.Template, Backend: ss.Backend,
			Resolution: Resolution{Width: ss.Width, Height: ss.Height}, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB,
			SizeBytes: ss.Bytes, CreatedAt: ss.CreatedAt, Metadata: ss.Metadata,
		},
		Owner: ss.Owner, Token: ss.Token, IP: ss.IP, Desktop: ss.Desktop, Isolation: ss.Isolation, Request: q,
		Driver: driver.State{Version: ss.Driver.Version, Driver: ss.Driver.Name, Data: ss.Driver.Data},
	}, nil
}

// storedRecording is a recording as the store keeps it.
type storedRecording struct {
	Version int       `json:"v"`
	Owner   string    `json:"owner"`
	Rec     Recording `json:"recording"`
}

const recordingVersion = 1

func (s *store) putRecording(r *Recording, owner string) error {
	b, err := json.Marshal(storedRecording{Version: recordingVersion, Owner: owner, Rec: *r})
	if err != nil {
		return fmt.Errorf("encode recording %s: %w", r.ID, err)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecordings).Put([]byte(r.ID), b)
	})
}

func (s *store) deleteRecording(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecordings).Delete([]byte(id))
	})
}

func (s *store) allRecordings() ([]*recorder, error) {
	var out []*recorder
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecordings).ForEach(func(k, b []byte) error {
			var sr storedRecording
			if err := json.Unmarshal(b, &sr); err != nil {
				return fmt.Errorf("decode recording %q: %w", k, err)
			}
			if sr.Version != recordingVersion {
				return fmt.Errorf("recording %q: record version %d: this cubicled reads version %d (was the data directory used by a newer cubicled?)", k, sr.Version, recordingVersion)
			}
			out = append(out, &recorder{Recording: sr.Rec, Owner: sr.Owner})
			return nil
		})
	})
	return out, err
}
