package exec

import (
	"encoding/json"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/orchard-env/orchard/agent/internal/proc"
)

// ChunkEvent and ExitEvent are the NDJSON lines of /exec/stream and follow
// (StreamEvent in models.py).
type ChunkEvent struct {
	Type   string `json:"type"`
	Data   string `json:"data"`
	Offset int64  `json:"offset"`
}

type ExitEvent struct {
	Type      string  `json:"type"`
	ExitCode  int     `json:"exit_code"`
	DurationS float64 `json:"duration_s"`
	TimedOut  bool    `json:"timed_out"`
	Signal    *string `json:"signal"`
}

// ndjson writes one JSON object per line and flushes it at once.
type ndjson struct {
	mu sync.Mutex
	w  http.ResponseWriter
	f  http.Flusher
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	n := &ndjson{w: w, f: f}
	n.flush()
	return n
}

func (n *ndjson) flush() {
	if n.f != nil {
		n.f.Flush()
	}
}

func (n *ndjson) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, _ = n.w.Write(append(b, '\n'))
	n.flush()
}

// textChunker tracks one stream's offset and, in text mode, holds back a
// character cut at a chunk boundary so it is not turned into U+FFFD.
type textChunker struct {
	stream  string
	b64     bool
	offset  int64
	pending []byte
}

func (t *textChunker) chunk(p []byte, final bool) *ChunkEvent {
	data := append(t.pending, p...)
	t.pending = nil
	if !t.b64 && !final {
		n := completeUTF8(data)
		t.pending = append([]byte(nil), data[n:]...)
		data = data[:n]
	}
	if len(data) == 0 {
		return nil
	}
	ev := &ChunkEvent{Type: t.stream, Data: encode(data, t.b64), Offset: t.offset}
	t.offset += int64(len(data))
	return ev
}

// flush sends what each chunker still holds back (the end of the streams).
func flushChunkers(out *ndjson, chunkers ...*textChunker) {
	for _, t := range chunkers {
		if ev := t.chunk(nil, true); ev != nil {
			out.send(ev)
		}
	}
}

type streamChunk struct {
	stream int
	data   []byte
}

// handleExecStream runs a command and streams its output: POST /exec/stream.
func (h *Handler) handleExecStream(w http.ResponseWriter, r *http.Request) {
	s, c, start, ok := h.startExec(w, r)
	if !ok {
		return
	}
	out := newNDJSON(w)
	events := make(chan streamChunk, 16)
	stop := make(chan struct{})
	sink := func(i int) func([]byte) {
		return func(b []byte) {
			select {
			case events <- streamChunk{i, append([]byte(nil), b...)}:
			case <-stop: // the answer is complete; drain and drop
			}
		}
	}
	pumps := []*proc.Pump{proc.StartPump(c.Stdout, false, sink(0)), proc.StartPump(c.Stderr, false, sink(1))}
	pumpsDone := make(chan struct{})
	go func() {
		<-pumps[0].Done()
		<-pumps[1].Done()
		close(pumpsDone)
	}()
	type exitRes struct {
		ws       syscall.WaitStatus
		timedOut bool
		at       time.Time
	}
	exited := make(chan exitRes, 1)
	go func() {
		ws, timedOut := proc.WaitExit(r.Context(), c.PID, c.Exit, s.Timeout)
		exited <- exitRes{ws, timedOut, time.Now()}
	}()
	chunkers := []*textChunker{{stream: "stdout", b64: s.b64}, {stream: "stderr", b64: s.b64}}
	emit := func(ch streamChunk) {
		if ev := chunkers[ch.stream].chunk(ch.data, false); ev != nil {
			out.send(ev)
		}
	}
	var res *exitRes
	var quiet <-chan time.Time
	lastData := time.Now()
	for done := pumpsDone; res == nil || done != nil; {
		select {
		case ch := <-events:
			emit(ch)
			lastData = time.Now()
		case e := <-exited:
			res = &e
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			quiet = t.C
		case <-done:
			done = nil
		case now := <-quiet:
			if (now.Sub(lastData) >= proc.PipeGrace && proc.AllDrained(pumps)) || now.Sub(res.at) >= proc.MaxSettle {
				done = nil
			}
		}
	}
	close(stop)
	for drained := false; !drained; {
		select {
		case ch := <-events:
			emit(ch)
		default:
			drained = true
		}
	}
	flushChunkers(out, chunkers...)
	ev := ExitEvent{Type: "exit", DurationS: res.at.Sub(start).Seconds(), TimedOut: res.timedOut}
	ev.ExitCode, ev.Signal = proc.ExitInfo(res.ws)
	if res.timedOut {
		ev.ExitCode = 124
	}
	out.send(ev)
}
