package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"sync"
	"unicode/utf8"
)

// capture holds one stream of a blocking exec. Up to limit bytes stay in
// memory whole; beyond that only the head and tail are kept (half the limit
// each) and the full stream goes to a spill file, so a huge output neither
// exhausts memory nor is lost.
type capture struct {
	mu       sync.Mutex
	limit    int
	dir      string
	name     string // "stdout" or "stderr", used in the spill file name
	buf      []byte // the whole stream until it spills, the head afterwards
	tail     []byte // recent bytes once spilled (trimmed lazily)
	total    int64
	spilled  bool
	file     *os.File
	path     string
	fileErr  error
	detached bool
}

func newCapture(limit int, dir, name string) *capture {
	if limit < 2 {
		limit = 2
	}
	return &capture{limit: limit, dir: dir, name: name}
}

// Write never fails: once detached (the exec has answered) bytes are drained
// and dropped so a lingering grandchild never blocks on a full pipe.
func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.detached {
		return len(p), nil
	}
	c.total += int64(len(p))
	if !c.spilled {
		if len(c.buf)+len(p) <= c.limit {
			c.buf = append(c.buf, p...)
			return len(p), nil
		}
		c.spilled = true
		all := append(c.buf, p...)
		c.toFile(all)
		head := c.limit / 2
		c.buf = append([]byte(nil), all[:head]...)
		c.pushTail(all[head:])
		return len(p), nil
	}
	c.toFile(p)
	c.pushTail(p)
	return len(p), nil
}

func (c *capture) tailSize() int { return c.limit - c.limit/2 }

// pushTail appends p to the tail, compacting only when it doubles, so each
// byte is copied a bounded number of times.
func (c *capture) pushTail(p []byte) {
	n := c.tailSize()
	if len(p) >= n {
		c.tail = append(c.tail[:0], p[len(p)-n:]...)
		return
	}
	if len(c.tail)+len(p) > 2*n {
		keep := n - len(p)
		c.tail = c.tail[:copy(c.tail, c.tail[len(c.tail)-keep:])]
	}
	c.tail = append(c.tail, p...)
}

func (c *capture) toFile(p []byte) {
	if c.fileErr != nil {
		return
	}
	if c.file == nil {
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			c.fileErr = err
			return
		}
		f, err := os.CreateTemp(c.dir, "exec-*."+c.name)
		if err != nil {
			c.fileErr = err
			return
		}
		c.file, c.path = f, f.Name()
	}
	if _, err := c.file.Write(p); err != nil {
		// A partial spill file would pose as the full output: remove it.
		c.fileErr = err
		_ = c.file.Close()
		_ = os.Remove(c.path)
		c.file, c.path = nil, ""
	}
}

// finish stops capturing and closes the spill file; later writes are dropped.
func (c *capture) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.detached = true
	if c.file != nil {
		_ = c.file.Close()
	}
}

// result returns the kept bytes (head, marker, tail when truncated) and the
// spill file path ("" when not truncated or when the spill failed).
func (c *capture) result() (data []byte, truncated bool, path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.spilled {
		return append([]byte(nil), c.buf...), false, ""
	}
	tail := c.tail
	if n := c.tailSize(); len(tail) > n {
		tail = tail[len(tail)-n:]
	}
	omitted := c.total - int64(len(c.buf)) - int64(len(tail))
	where := "full output in " + c.path
	if c.fileErr != nil {
		where = "full output not saved: " + c.fileErr.Error()
	}
	marker := fmt.Sprintf("\n…[orchard: %d bytes omitted; %s]…\n", omitted, where)
	out := make([]byte, 0, len(c.buf)+len(marker)+len(tail))
	out = append(append(append(out, c.buf...), marker...), tail...)
	return out, true, c.path
}

// procOutputLimit bounds the in-memory part of each background-process stream.
const procOutputLimit = 4 << 20

// outBuf is one stream of a background process, readable by absolute byte
// offset for as long as the process is known. The most recent bytes stay in
// memory (at most limit); once the stream outgrows that, every byte is also
// appended to a spill file, so old offsets stay readable. Only if the spill
// file cannot be written are old bytes dropped (reads then say dropped).
type outBuf struct {
	mu       sync.Mutex
	limit    int
	dir      string
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

func newOutBuf(limit int, dir, name string) *outBuf {
	if limit < 2 {
		limit = 2
	}
	return &outBuf{limit: limit, dir: dir, name: name, changed: make(chan struct{})}
}

func (b *outBuf) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *outBuf) Write(p []byte) (int, error) {
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
func (b *outBuf) spill() {
	b.spilled = true
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return
	}
	f, err := os.CreateTemp(b.dir, "proc-*."+b.name)
	if err != nil {
		return
	}
	if _, err := f.Write(b.mem); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return
	}
	b.file, b.fileEnd, b.fileOK = f, b.total, true
}

// close marks the end of the stream; later writes are drained and dropped.
func (b *outBuf) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.notify()
	}
}

// remove forgets the stream and deletes its spill file.
func (b *outBuf) remove() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.notify()
	}
	if b.file != nil {
		_ = b.file.Close()
		_ = os.Remove(b.file.Name())
		b.file, b.fileOK = nil, false
	}
	b.mem, b.memStart = nil, b.total
}

// state reports the stream's size, whether it has ended, and a channel
// closed on the next change.
func (b *outBuf) state() (total int64, closed bool, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.closed, b.changed
}

// read returns up to max bytes from off. start is where data really begins:
// later than off (dropped true) only when those bytes were lost.
func (b *outBuf) read(off int64, max int) (data []byte, start int64, dropped bool, err error) {
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

// encode renders bytes as JSON-safe text ("text": invalid UTF-8 replaced) or base64.
func encode(p []byte, b64 bool) string {
	if b64 {
		return base64.StdEncoding.EncodeToString(p)
	}
	return strings.ToValidUTF8(string(p), "\uFFFD")
}

// completeUTF8 returns how many leading bytes of p to send now in text mode:
// a multi-byte character cut at the end is held back for the next chunk
// rather than turned into replacement characters.
func completeUTF8(p []byte) int {
	for i := 1; i <= 3 && i <= len(p); i++ {
		c := p[len(p)-i]
		if c < utf8.RuneSelf {
			return len(p) // ASCII: nothing cut
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(p[len(p)-i:]) && len(p) > i {
				return len(p) - i
			}
			return len(p)
		}
	}
	return len(p)
}
