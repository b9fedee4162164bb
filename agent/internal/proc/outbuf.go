package proc

import (
	"fmt"
	"os"
	"sync"
)

// OutBuf is one stream of a background process, readable by absolute byte
// offset for as long as the process is known. The most recent bytes stay in
// memory (at most limit); once the stream outgrows that, every byte is also
// appended to a spill file, so old offsets stay readable. Only if the spill
// file cannot be written are old bytes dropped (reads then say dropped).
type OutBuf struct {
	mu       sync.Mutex
	limit    int
	spillDir *SpillDir
	name     string
	mem      []byte // bytes [memStart, total)
	memStart int64
	total    int64
	file     *os.File // holds [0, fileEnd) once spilled
	fileEnd  int64
	fileOK   bool // still appending to file
	spilled  bool
	closed   bool
	changed  chan struct{} // closed and replaced on every change
}

// NewOutBuf keeps the last limit bytes in memory and spills into spill beyond that.
func NewOutBuf(limit int, spill *SpillDir, name string) *OutBuf {
	if limit < 2 {
		limit = 2
	}
	return &OutBuf{limit: limit, spillDir: spill, name: name, changed: make(chan struct{})}
}

func (b *OutBuf) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *OutBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(p) == 0 {
		return len(p), nil
	}
	if !b.spilled && len(b.mem)+len(p) > b.limit {
		b.spill()
	}
	if b.fileOK {
		if _, err := b.file.Write(p); err != nil {
			b.fileOK = false
		} else {
			b.fileEnd += int64(len(p))
		}
	}
	if len(p) >= b.limit {
		b.memStart = b.total + int64(len(p)-b.limit)
		b.mem = append(b.mem[:0], p[len(p)-b.limit:]...)
	} else {
		if len(b.mem)+len(p) > b.limit {
			keep := b.limit / 2
			if b.limit-len(p) < keep {
				keep = b.limit - len(p)
			}
			drop := len(b.mem) - keep
			b.mem = b.mem[:copy(b.mem, b.mem[drop:])]
			b.memStart += int64(drop)
		}
		b.mem = append(b.mem, p...)
	}
	b.total += int64(len(p))
	b.notify()
	return len(p), nil
}

// spill moves the in-memory bytes to a new file; they are all of the stream
// so far because nothing is dropped from memory before the first spill.
func (b *OutBuf) spill() {
	b.spilled = true
	f, err := b.spillDir.Create("proc-*." + b.name)
	if err != nil {
		return
	}
	if _, err := f.Write(b.mem); err != nil {
		_ = f.Close()
		b.spillDir.Remove(f.Name())
		return
	}
	b.file, b.fileEnd, b.fileOK = f, b.total, true
}

// Close marks the end of the stream; later writes are drained and dropped.
func (b *OutBuf) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.notify()
	}
}

// Remove forgets the stream and deletes its spill file.
func (b *OutBuf) Remove() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.notify()
	}
	if b.file != nil {
		_ = b.file.Close()
		b.spillDir.Remove(b.file.Name())
		b.file, b.fileOK = nil, false
	}
	b.mem, b.memStart = nil, b.total
}

// State reports the stream's size, whether it has ended, and a channel
// closed on the next change.
func (b *OutBuf) State() (total int64, closed bool, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.closed, b.changed
}

// Read returns up to max bytes from off. start is where data really begins:
// later than off (dropped true) only when those bytes were lost.
func (b *OutBuf) Read(off int64, max int) (data []byte, start int64, dropped bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if off < 0 || off > b.total {
		return nil, off, false, fmt.Errorf("offset %d outside the stream (0..%d)", off, b.total)
	}
	if off < b.memStart && b.file != nil && off < b.fileEnd {
		n := b.fileEnd - off
		if n > int64(max) {
			n = int64(max)
		}
		data = make([]byte, n)
		if _, err := b.file.ReadAt(data, off); err != nil {
			return nil, off, false, fmt.Errorf("read spill file: %w", err)
		}
		return data, off, false, nil
	}
	if off < b.memStart {
		off, dropped = b.memStart, true
	}
	rest := b.mem[off-b.memStart:]
	if len(rest) > max {
		rest = rest[:max]
	}
	return append([]byte(nil), rest...), off, dropped, nil
}
