package daemon

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/shm"
)

// Checkpoints (--state-dir, --checkpoint-interval): the design, the file names and every failure outcome are told
// once, in doc.go ("Checkpoints") and package stream's ("Continuous checkpoints"); the file format is index/CHECKPOINT.md. This file holds
// the daemon's part: ckptStore (write, look up, remove the files of one state directory) and the meta that names the
// worker, ring epoch and ring head a checkpoint corresponds to.

// ckptMeta is the daemon's part of a checkpoint (the index's opaque meta). Wire format: never change without
// changing ckptMagic.
const (
	ckptMagic    = "KVSHMD\x00\x01"
	ckptMetaSize = len(ckptMagic) + 3*8 // magic, worker_id, ring epoch, ring head
	ckptSuffix   = ".ckpt"
)

// Checkpoint restore results (the result label of kvshm_checkpoint_restores_total).
const (
	ckptRestored = "restored" // the index was restored
	ckptMissing  = "missing"  // no checkpoint for this worker and ring epoch (e.g. the daemon was killed)
	ckptStale    = "stale"    // the checkpoint's head, worker or index config does not match the ring
	ckptCorrupt  = "corrupt"  // the file failed validation (index.ErrCheckpoint)
	ckptError    = "error"    // the file could not be read
)

var ckptResults = []string{ckptRestored, ckptMissing, ckptStale, ckptCorrupt, ckptError}

func encodeCkptMeta(worker, epoch, head uint64) []byte {
	b := append(make([]byte, 0, ckptMetaSize), ckptMagic...)
	b = binary.LittleEndian.AppendUint64(b, worker)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	return binary.LittleEndian.AppendUint64(b, head)
}

// ckptPrefix is the file name prefix of a stream's checkpoints: w<worker>- (ALL) or w<worker>r<rank>- (per rank).
func ckptPrefix(k streamKey) string {
	if !k.PerRank {
		return fmt.Sprintf("w%d-", k.Worker)
	}
	return fmt.Sprintf("w%dr%d-", k.Worker, k.Rank)
}

func ckptName(k streamKey, epoch uint64) string {
	return fmt.Sprintf("%s%d%s", ckptPrefix(k), epoch, ckptSuffix)
}

// prepareStateDir creates dir 0700 when missing and checks that it is a directory owned by the daemon's user with no
// group/other permissions (a checkpoint holds every worker's block hashes).
func prepareStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("stat state directory %s: %w", dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("state directory %s is not a directory: %w", dir, ErrUnsafeStateDir)
	case int(st.Uid) != os.Getuid():
		return fmt.Errorf("state directory %s is owned by uid %d, not %d: %w", dir, st.Uid, os.Getuid(), ErrUnsafeStateDir)
	case st.Mode&0o077 != 0:
		return fmt.Errorf("state directory %s has mode %04o (want 0700): %w", dir, st.Mode&0o7777, ErrUnsafeStateDir)
	}
	return nil
}

// removeTempCheckpoints removes the leftover temporary files of a write a crash interrupted (under the state
// directory's lock: no other daemon is writing them).
func removeTempCheckpoints(dir string) {
	tmps, _ := filepath.Glob(filepath.Join(dir, "w*"+ckptSuffix+".tmp*"))
	for _, p := range tmps {
		_ = os.Remove(p)
	}
}

// ckptStore is the checkpoint files of one --state-dir (an empty dir: none). The server hands it to each
// attachment (whose drain goroutine writes continuous checkpoints) and uses it at attach, forget and shutdown.
type ckptStore struct {
	dir    string
	writes *prometheus.CounterVec // kvshm_checkpoint_writes_total{result}
	log    *slog.Logger
}

// save writes ix: temporary file 0600, fsync, rename, fsync of the directory. It writes ix as the checkpoint of the stream's ring epoch at ring position head (the index must hold
// exactly the records before head) and logs and counts the outcome. Holding the index's read lock only while the
// bytes are serialized (WriteCheckpoint), it lets queries run meanwhile; fsync and rename happen after.
func (c *ckptStore) save(k streamKey, epoch uint64, ix *index.Indexer, head uint64, trigger string) error {
	return c.write(k, epoch, head, trigger, func(w *bufio.Writer) error {
		return ix.WriteCheckpoint(w, encodeCkptMeta(k.Worker, epoch, head))
	})
}

// saveCopy writes cp (an index.CheckpointCopy taken where the index held exactly the records before head) like save
// writes an index: the second half of an asynchronous continuous checkpoint, on its writer goroutine.
func (c *ckptStore) saveCopy(k streamKey, epoch uint64, cp *index.CheckpointCopy, head uint64, trigger string) error {
	return c.write(k, epoch, head, trigger, func(w *bufio.Writer) error {
		return cp.WriteCheckpoint(w, encodeCkptMeta(k.Worker, epoch, head))
	})
}

// write writes a checkpoint file with fill (writeFileAtomic) and logs and counts the outcome.
func (c *ckptStore) write(k streamKey, epoch, head uint64, trigger string, fill func(*bufio.Writer) error) error {
	dir := c.dir
	name := ckptName(k, epoch)
	log := c.log.With(k.LogAttrs()...).With("checkpoint", filepath.Join(dir, name))
	size, err := writeFileAtomic(dir, name, fill)
	if err != nil {
		c.writes.WithLabelValues("failed").Inc()
		log.Error("cannot write checkpoint: the next daemon will report unknown history for this worker", "err", err, "trigger", trigger)
		return err
	}
	c.writes.WithLabelValues("ok").Inc()
	if trigger == "shutdown" || trigger == "final" {
		log.Info("checkpoint written", "epoch", epoch, "head", head, "bytes", size, "trigger", trigger)
	} else {
		log.Debug("checkpoint written", "epoch", epoch, "head", head, "bytes", size, "trigger", trigger)
	}
	return nil
}

func writeFileAtomic(dir, name string, fill func(*bufio.Writer) error) (int64, error) {
	f, err := os.CreateTemp(dir, name+".tmp*") // mode 0600
	if err != nil {
		return 0, fmt.Errorf("create temporary file: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := fill(bw); err != nil {
		return 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("close %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return 0, fmt.Errorf("rename into place: %w", err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable
		_ = d.Close()
	}
	return fi.Size(), nil
}

// ckptLoad is the outcome of looking for a stream's checkpoint at ATTACH.
type ckptLoad struct {
	ix     *index.Indexer // nil unless result is ckptRestored
	head   uint64         // the ring head the restored index corresponds to (the reader was moved there)
	moved  bool           // the reader was moved forward to head (a checkpoint ahead of the released head)
	result string
	why    string // for the log when not restored
}

// load reads the stream's checkpoint of the ring epoch (ckptName) and accepts it when it was written for
// this worker and ring epoch, at the ring's head or at the end of a published record after it (the previous daemon
// died between the checkpoint's rename and its head release: r is then moved there), with the index configuration
// the ring asks for (the loss policy and dump shape
// are flags, not state: SetPolicies applies the running daemon's). It does not remove the file (see
// remove).
func (c *ckptStore) load(k streamKey, epoch uint64, r *shm.Reader, cfg index.Config) ckptLoad {
	head := r.Stats().Head
	worker := k.Worker
	path := filepath.Join(c.dir, ckptName(k, epoch))
	// Only a regular file is read, and at most its size: a symlink (to /dev/zero, say) is not followed, and a FIFO
	// or device neither blocks the open (O_NONBLOCK) nor is read.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return ckptLoad{result: ckptMissing, why: "no checkpoint for this worker and ring epoch (the previous daemon did not shut down gracefully, or ran without --state-dir)"}
	}
	if err != nil {
		return ckptLoad{result: ckptError, why: fmt.Sprintf("open checkpoint %s: not a regular file, or unreadable: %v", path, err)}
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return ckptLoad{result: ckptError, why: fmt.Sprintf("checkpoint %s is not a regular file (%v)", path, err)}
	}
	ix, meta, err := index.ReadCheckpoint(f) // sized from Stat: one allocation for the file's bytes, read to its size
	switch {
	case errors.Is(err, index.ErrCheckpoint):
		return ckptLoad{result: ckptCorrupt, why: fmt.Sprintf("corrupt checkpoint %s: %v", path, err)}
	case err != nil:
		return ckptLoad{result: ckptError, why: fmt.Sprintf("read checkpoint %s: %v", path, err)}
	case len(meta) != ckptMetaSize || string(meta[:len(ckptMagic)]) != ckptMagic:
		return ckptLoad{result: ckptCorrupt, why: fmt.Sprintf("checkpoint %s lacks the daemon's metadata", path)}
	}
	mw := binary.LittleEndian.Uint64(meta[len(ckptMagic):])
	me := binary.LittleEndian.Uint64(meta[len(ckptMagic)+8:])
	mh := binary.LittleEndian.Uint64(meta[len(ckptMagic)+16:])
	switch {
	case mw != worker || me != epoch:
		return ckptLoad{result: ckptStale, why: fmt.Sprintf("checkpoint was written for worker %d ring epoch %d", mw, me)}
	case mh < head:
		return ckptLoad{result: ckptStale, why: fmt.Sprintf("checkpoint head %d differs from the ring's head %d (another daemon consumed the ring since)", mh, head)}
	case !sameShape(ix.Config(), cfg):
		return ckptLoad{result: ckptStale, why: fmt.Sprintf("checkpoint index config %+v differs from the ring's %+v", ix.Config(), cfg)}
	}
	if mh > head {
		// The previous daemon died between writing this checkpoint and releasing its head (the release follows the
		// rename): the records up to mh are in the checkpoint and still in the ring. Resume after them, provided
		// mh is where a published record ends.
		if err := r.SkipTo(mh); err != nil {
			return ckptLoad{result: ckptStale, why: fmt.Sprintf("checkpoint head %d is ahead of the ring's head %d and not the end of a published record: %v", mh, head, err)}
		}
	}
	ix.SetPolicies(cfg.OnLoss, cfg.DumpShape)
	return ckptLoad{ix: ix, result: ckptRestored, head: mh, moved: mh > head}
}

// sameShape compares the parts of an index configuration a checkpoint must match (not the policies).
func sameShape(a, b index.Config) bool {
	return a.WorkerID == b.WorkerID && a.BlockSize == b.BlockSize && a.MaxBufferSize == b.MaxBufferSize
}

// remove deletes every checkpoint of the stream k (any ring epoch; not those of the worker's other
// scopes): it was consumed, or its stream was replaced or forgotten. Errors are logged.
func (c *ckptStore) remove(k streamKey) { c.removeBut(k, "") }

// removeBut is remove sparing the file named keep (a restored checkpoint that stays valid
// under --checkpoint-interval: the head is released only after a newer one replaced it).
func (c *ckptStore) removeBut(k streamKey, keep string) {
	if c.dir == "" {
		return
	}
	prefix := ckptPrefix(k)
	paths, _ := filepath.Glob(filepath.Join(c.dir, prefix+"*"+ckptSuffix))
	for _, p := range paths {
		if rest := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), prefix), ckptSuffix); rest == "" || strings.ContainsFunc(rest, func(r rune) bool { return r < '0' || r > '9' }) {
			continue // another worker's file or not ours (w1-2.ckpt must not match w1-*-x.ckpt patterns)
		}
		if filepath.Base(p) == keep {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			c.log.Warn("cannot remove checkpoint", "path", p, "err", err)
		} else if err == nil {
			c.log.Debug("checkpoint removed", "path", p)
		}
	}
}
