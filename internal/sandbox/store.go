package sandbox

import (
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The store is bbolt: a single-file, embedded, transactional key/value store
// with no cgo and no server, which is all the manager needs to survive a
// restart (a handful of records, written on state changes only).

var bucketSandboxes = []byte("sandboxes")

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
		_, err := tx.CreateBucketIfNotExists(bucketSandboxes)
		return err
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
