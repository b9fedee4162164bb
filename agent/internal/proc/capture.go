package proc

import (
	"fmt"
	"os"
	"sync"
)

// Capture holds one stream of a blocking exec. Up to limit bytes stay in
// memory whole; beyond that only the head and tail are kept (half the limit
// each) and the full stream goes to a spill file, so a huge output neither
// exhausts memory nor is lost.
type Capture struct {
	mu       sync.Mutex
	limit    int
	spill    *SpillDir
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

// NewCapture keeps up to limit bytes in memory and spills the rest into spill.
func NewCapture(limit int, spill *SpillDir, name string) *Capture {
	if limit < 2 {
		limit = 2
	}
	return &Capture{limit: limit, spill: spill, name: name}
}

// Write never fails: once detached (the exec has answered) bytes are drained
// and dropped so a lingering grandchild never blocks on a full pipe.
func (c *Capture) Write(p []byte) (int, error) {
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

func (c *Capture) tailSize() int { return c.limit - c.limit/2 }

// pushTail appends p to the tail, compacting only when it doubles, so each
// byte is copied a bounded number of times.
func (c *Capture) pushTail(p []byte) {
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

func (c *Capture) toFile(p []byte) {
	if c.fileErr != nil {
		return
	}
	if c.file == nil {
		f, err := c.spill.Create("exec-*." + c.name)
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
		c.spill.Remove(c.path)
		c.file, c.path = nil, ""
	}
}

// Finish stops capturing and closes the spill file; later writes are dropped.
func (c *Capture) Finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.detached = true
	if c.file != nil {
		_ = c.file.Close()
	}
}

// Result returns the kept bytes (head, marker, tail when truncated) and the
// spill file path ("" when not truncated or when the spill failed).
func (c *Capture) Result() (data []byte, truncated bool, path string) {
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
