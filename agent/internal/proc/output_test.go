package proc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard-env/orchard/agent/internal/testutil"
)

func TestCapture(t *testing.T) {
	full := []byte("0123456789abcdefghijklmnopqrstuvwxyz")
	cases := []struct {
		name      string
		limit     int
		chunks    []int // sizes of successive writes
		truncated bool
	}{
		{"under the cap", 64, []int{36}, false},
		{"exactly the cap", 36, []int{10, 26}, false},
		{"over in one write", 10, []int{36}, true},
		{"over byte by byte", 10, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, true},
		{"odd cap, mixed writes", 7, []int{3, 9, 1, 20, 3}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "spill")
			cp := NewCapture(c.limit, NewSpillDir(dir), "stdout")
			rest := full
			for _, n := range c.chunks {
				if _, err := cp.Write(rest[:n]); err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
			}
			cp.Finish()
			got, truncated, path := cp.Result()
			if truncated != c.truncated {
				t.Fatalf("truncated %v", truncated)
			}
			if !truncated {
				if !bytes.Equal(got, full) || path != "" {
					t.Fatalf("got %q path %q", got, path)
				}
				return
			}
			head, tail := c.limit/2, c.limit-c.limit/2
			want := fmt.Sprintf("%s\n…[orchard: %d bytes omitted; full output in %s]…\n%s",
				full[:head], len(full)-c.limit, path, full[len(full)-tail:])
			if string(got) != want {
				t.Fatalf("got  %q\nwant %q", got, want)
			}
			spilled, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(spilled, full) {
				t.Fatalf("spill file %q: %v", spilled, err)
			}
			// Writes after finish (a lingering grandchild) are dropped.
			_, _ = cp.Write([]byte("late"))
			if again, _, _ := cp.Result(); !bytes.Equal(again, got) {
				t.Fatal("capture changed after finish")
			}
		})
	}
}

func TestCaptureSpillFailure(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cp := NewCapture(4, NewSpillDir(filepath.Join(blocker, "sub")), "stdout") // a folder under a file cannot exist
	_, _ = cp.Write([]byte("abcdefgh"))
	cp.Finish()
	got, truncated, path := cp.Result()
	if !truncated || path != "" || !strings.HasPrefix(string(got), "ab\n") || !strings.Contains(string(got), "full output not saved") || !strings.HasSuffix(string(got), "gh") {
		t.Fatalf("got %q %v %q", got, truncated, path)
	}
}

func TestOutBuf(t *testing.T) {
	var full []byte
	for i := 0; i < 200; i++ {
		full = append(full, fmt.Sprintf("line %03d\n", i)...)
	}
	cases := []struct {
		name      string
		dir       func(t *testing.T) string
		chunk     int
		spills    bool
		dropsHead bool
	}{
		{"fits in memory", func(t *testing.T) string { return filepath.Join(t.TempDir(), "spill") }, 7, false, false},
		{"spills to disk", func(t *testing.T) string { return filepath.Join(t.TempDir(), "spill") }, 13, true, false},
		{"spill fails: old bytes dropped", func(t *testing.T) string {
			f := filepath.Join(t.TempDir(), "file")
			_ = os.WriteFile(f, nil, 0o644)
			return filepath.Join(f, "sub")
		}, 13, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			limit := len(full) + 1
			if c.spills {
				limit = 256
			}
			b := NewOutBuf(limit, NewSpillDir(c.dir(t)), "p.stdout")
			for rest := full; len(rest) > 0; {
				n := c.chunk
				if n > len(rest) {
					n = len(rest)
				}
				_, _ = b.Write(rest[:n])
				rest = rest[n:]
			}
			b.Close()
			if total, closed, _ := b.State(); total != int64(len(full)) || !closed {
				t.Fatalf("state %d %v", total, closed)
			}
			// Every offset reads back the right bytes, in pieces of any size.
			for _, max := range []int{1, 100, 4096} {
				for off := int64(0); off < int64(len(full)); off += 37 {
					data, start, dropped, err := b.Read(off, max)
					if err != nil {
						t.Fatal(err)
					}
					if dropped != (c.dropsHead && start > off) || (!c.dropsHead && start != off) {
						t.Fatalf("read(%d): start %d dropped %v", off, start, dropped)
					}
					if !bytes.Equal(data, full[start:start+int64(len(data))]) || len(data) == 0 || len(data) > max {
						t.Fatalf("read(%d, %d) = %q", off, max, data)
					}
				}
			}
			if _, _, _, err := b.Read(int64(len(full))+1, 10); err == nil {
				t.Fatal("reading past the end must fail")
			}
			if data, _, _, _ := b.Read(int64(len(full)), 10); len(data) != 0 {
				t.Fatal("reading at the end returns nothing")
			}
			if c.spills && !c.dropsHead && b.file == nil {
				t.Fatal("no spill file")
			}
			name := ""
			if b.file != nil {
				name = b.file.Name()
			}
			b.Remove()
			if name != "" {
				if _, err := os.Stat(name); !os.IsNotExist(err) {
					t.Fatalf("spill file kept: %v", err)
				}
			}
		})
	}
}

// Output already written must not be dropped because the pump was slow to run:
// a pipe with unread bytes, or a chunk still in the pump's hands, is not drained.
func TestPumpDrained(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	idle := &Pump{done: make(chan struct{})} // stands for a pump that has not run yet
	idle.rc, _ = r.SyscallConn()
	if !idle.drained() {
		t.Fatal("empty pipe reported as not drained")
	}
	if _, err := w.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	if idle.drained() {
		t.Fatal("pipe with unread bytes reported as drained")
	}

	release := make(chan struct{})
	p := StartPump(r, false, func([]byte) { <-release }) // a sink that is slow to take the chunk
	testutil.Eventually(t, "pump took the chunk", func() bool { return p.busy.Load() })
	if p.drained() {
		t.Fatal("chunk in the pump's hands reported as drained")
	}
	close(release)
	testutil.Eventually(t, "pump handed the chunk on", func() bool { return p.drained() })
}
