package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	mmap "github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// DefaultDir is the directory rings are created in by default: /dev/shm when it exists, else os.TempDir().
func DefaultDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// Options configure Create. The zero value is valid (DefaultCapacity, max_record = capacity/8, mode 0600).
type Options struct {
	// Capacity is the data area size: a power of two in [MinCapacity, MaxCapacity]; 0 means DefaultCapacity.
	Capacity uint64
	// MaxRecord is the largest record including its 8-byte header: a multiple of 8 in
	// [MinMaxRecord, Capacity/8]; 0 means Capacity/8.
	MaxRecord     uint32
	WorkerID      uint64
	KVBlockSize   uint32
	MaxBufferSize uint32
	Mode          os.FileMode // permission bits of the file; 0 = 0600
}

// identity is the producer identity written into the header. Tests pin it to make ring images reproducible.
type identity struct {
	pid       uint32
	startTime uint64
	epoch     uint64
}

func selfIdentity() (identity, error) {
	st, err := ReadProcStat(0)
	if err != nil {
		return identity{}, fmt.Errorf("read producer start time: %w", err)
	}
	epoch := uint64(time.Now().UnixNano())
	if epoch == 0 {
		epoch = 1
	}
	return identity{pid: uint32(os.Getpid()), startTime: st.StartTime, epoch: epoch}, nil
}

// ProcStat is what kvshm reads from /proc/<pid>/stat.
type ProcStat struct {
	State     byte   // field 3: R, S, D, T, Z (zombie), X (dead), ...
	StartTime uint64 // field 22: clock ticks since boot (the ring header's producer_start_time)
}

// ReadProcStat reads /proc/<pid>/stat (pid 0: the calling process). A process that does not exist yields an error
// wrapping os.ErrNotExist. This is kvshm's one /proc/<pid>/stat parser in Go (Python: kvshm._proc.proc_stat).
//
// The calling process reads its own through its main thread, /proc/self/task/<pid>/stat: the same start time, and a
// path a user-mode emulator leaves to the kernel, whereas qemu-user answers /proc/self/stat and /proc/<own pid>/stat
// itself (state "0" and a start time of its own, which the daemon, reading the kernel's, would take for another
// process).
func ReadProcStat(pid int) (ProcStat, error) {
	if self := os.Getpid(); pid == 0 || pid == self {
		return readProcStat("/proc/self/task/" + strconv.Itoa(self) + "/stat")
	}
	return readProcStat("/proc/" + strconv.Itoa(pid) + "/stat")
}

// readProcStat parses a /proc/<pid>/stat file. The command name (field 2) may contain spaces and parentheses, so
// fields are counted after the last ')'.
func readProcStat(path string) (ProcStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ProcStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcStat{}, fmt.Errorf("parse %s: no command name", path)
	}
	// After ") " come fields 3, 4, ...; field 22 is the 20th of them.
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return ProcStat{}, fmt.Errorf("parse %s: %d fields after the command name", path, len(f))
	}
	v, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return ProcStat{}, fmt.Errorf("parse %s: start time: %w", path, err)
	}
	return ProcStat{State: f[0][0], StartTime: v}, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Capacity == 0 {
		o.Capacity = DefaultCapacity
	}
	c := o.Capacity
	if c < MinCapacity || c > MaxCapacity || c&(c-1) != 0 {
		return o, fmt.Errorf("%w: capacity %d is not a power of two in [%d, %d]", ErrOptions, c, MinCapacity, MaxCapacity)
	}
	if o.MaxRecord == 0 {
		o.MaxRecord = uint32(c / maxRecordDivisor)
	}
	if m := uint64(o.MaxRecord); m < MinMaxRecord || m > c/maxRecordDivisor || m%RecordAlign != 0 {
		return o, fmt.Errorf("%w: max_record %d not a multiple of %d in [%d, capacity/%d]",
			ErrOptions, m, RecordAlign, MinMaxRecord, maxRecordDivisor)
	}
	if o.Mode == 0 {
		o.Mode = 0o600
	}
	if o.Mode&^os.ModePerm != 0 {
		return o, fmt.Errorf("%w: mode %v has bits other than permissions", ErrOptions, o.Mode)
	}
	return o, nil
}

// createFile creates path exclusively, locks it for the producer and preallocates size bytes. On EEXIST it tells
// a live producer (ErrLocked) from a stale file (ErrExist).
func createFile(path string, size int64, mode os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, existingFileError(path, err)
		}
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	// The umask may have cleared bits the caller asked for; set exactly the requested mode.
	if err := f.Chmod(mode); err != nil {
		return fail(err)
	}
	if err := flockNB(f); err != nil {
		return fail(err)
	}
	if err := preallocate(f, size); err != nil {
		return fail(err)
	}
	return f, nil
}

func existingFileError(path string, cause error) error {
	g, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrExist, cause)
	}
	defer g.Close()
	if err := flockNB(g); err != nil {
		return err
	}
	return fmt.Errorf("%w (no producer holds it): %w", ErrExist, cause)
}

// flockNB takes the producer lock: flock(LOCK_EX|LOCK_NB), held until the file is closed. The lock belongs to the
// open file description, so a second open of the same file, in this process or another, is refused.
func flockNB(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case err == unix.EINTR:
			continue
		case err == unix.EWOULDBLOCK:
			return ErrLocked
		default:
			return fmt.Errorf("lock ring file: %w", err)
		}
	}
}

// preallocate reserves every block of the file now, so that a full tmpfs fails here and not as SIGBUS on a later
// store into the mapping. File systems without fallocate get the blocks by writing zeros.
func preallocate(f *os.File, size int64) error {
	for {
		err := fallocate(int(f.Fd()), 0, 0, size)
		switch {
		case err == nil:
			return nil
		case err == unix.EINTR:
			continue
		case err == unix.ENOSPC || err == unix.EDQUOT:
			return fmt.Errorf("%w: preallocate %d bytes in %s: %w", ErrNoSpace, size, f.Name(), err)
		case err == unix.EOPNOTSUPP || err == unix.ENOSYS:
			return writeZeros(f, size)
		default:
			return fmt.Errorf("preallocate ring file: %w", err)
		}
	}
}

// fallocate is unix.Fallocate; tests replace it to simulate file systems without fallocate.
var fallocate = unix.Fallocate

func writeZeros(f *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		n := min(int64(len(buf)), size-off)
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
				return fmt.Errorf("%w: write %d bytes in %s: %w", ErrNoSpace, size, f.Name(), err)
			}
			return fmt.Errorf("preallocate ring file: %w", err)
		}
		off += n
	}
	return f.Sync()
}

// mapFile maps the whole ring file shared and writable (mmap-go: MAP_SHARED, PROT_READ|PROT_WRITE). The mapping
// is page-aligned, which the atomic offsets rely on (checked in checkAtomicAlignment).
func mapFile(f *os.File, size int64) ([]byte, error) {
	m, err := mmap.MapRegion(f, int(size), mmap.RDWR, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("map ring file: %w", err)
	}
	return m, nil
}

func unmap(m []byte) error {
	mm := mmap.MMap(m)
	if err := mm.Unmap(); err != nil {
		return fmt.Errorf("unmap ring file: %w", err)
	}
	return nil
}

// openChecked opens an existing ring file and returns it with its size, refusing anything that cannot be a ring
// before it is mapped (not a regular file, or larger than any valid ring).
func openChecked(path string, flag int) (*os.File, int64, error) {
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%w: %s is not a regular file", ErrHeader, path)
	}
	if fi.Size() < HeaderSize || fi.Size() > HeaderSize+MaxCapacity {
		f.Close()
		return nil, 0, fmt.Errorf("%w: file is %d bytes, not 4096 + a capacity in [%d, %d]",
			ErrHeader, fi.Size(), MinCapacity, MaxCapacity)
	}
	return f, fi.Size(), nil
}

// Inspect reads a ring's header page without mapping or locking the file (for `kvshmd inspect`). It returns the
// fields it could decode even when it also returns a validation error (ErrMagic, ErrVersion, ErrHeader, or a
// *CorruptionError for invalid head/tail words); a ring in state INIT is not an error here.
func Inspect(path string) (Header, RingStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, RingStats{}, fmt.Errorf("inspect ring: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Header{}, RingStats{}, fmt.Errorf("inspect ring: %w", err)
	}
	page := make([]byte, HeaderSize)
	if n, err := f.ReadAt(page, 0); n < HeaderSize {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("%w: file is %d bytes, smaller than the header", ErrHeader, n)
		}
		return Header{}, RingStats{}, fmt.Errorf("inspect ring %s: %w", path, err)
	}
	h := parseHeader(page)
	st := statsFromPage(page, h.Capacity)
	if err := h.validate(fi.Size()); err != nil {
		return h, st, fmt.Errorf("inspect ring %s: %w", path, err)
	}
	if err := checkPositions(st.Head, st.Tail, h.Capacity); err != nil {
		return h, st, fmt.Errorf("inspect ring %s: %w", path, err)
	}
	return h, st, nil
}

// statsFromPage decodes the shared counters from a private copy of the header page.
func statsFromPage(p []byte, capacity uint64) RingStats {
	c := func(off int) uint64 { return binary.LittleEndian.Uint64(p[off:]) }
	st := RingStats{
		Head: c(offHead), Tail: c(offTail), Capacity: capacity,
		DroppedEvents: c(offDroppedEvents), DroppedBytes: c(offDroppedBytes),
		LossPending: c(offLossPending) != 0, LossFirstSeq: c(offLossFirstSeq), LossLastSeq: c(offLossLastSeq),
		ConsumerHeartbeat: c(offHeartbeat), State: State(binary.LittleEndian.Uint32(p[offState:])),
	}
	st.ReadPos = st.Head
	if checkPositions(st.Head, st.Tail, capacity) == nil {
		st.Used = st.Tail - st.Head
	}
	return st
}
