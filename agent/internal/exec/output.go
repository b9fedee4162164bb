package exec

import (
	"net/http"
	"strconv"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// OutputResult is the answer of GET /processes/{id}/output (ProcessOutput in models.py).
type OutputResult struct {
	Stream     string `json:"stream"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	Data       string `json:"data"`
	Encoding   string `json:"encoding"`
	EOF        bool   `json:"eof"`
	Dropped    bool   `json:"dropped"`
}

// maxOutputRead bounds one /output answer.
const maxOutputRead = 4 << 20

func queryInt(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, api.BadRequest("%s must be a non-negative integer", name)
	}
	return n, nil
}

func queryEncoding(r *http.Request) (bool, error) {
	switch e := r.URL.Query().Get("encoding"); e {
	case "", "text":
		return false, nil
	case "base64":
		return true, nil
	default:
		return false, api.BadRequest("encoding must be text or base64")
	}
}

func procOutput(w http.ResponseWriter, r *http.Request, p *proc.Proc) error {
	stream := r.URL.Query().Get("stream")
	idx := 0
	switch stream {
	case "", "stdout":
		stream = "stdout"
	case "stderr":
		idx = 1
	default:
		return api.BadRequest("stream must be stdout or stderr")
	}
	off, err := queryInt(r, "offset", 0)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 65536)
	if err != nil {
		return err
	}
	if limit == 0 || limit > maxOutputRead {
		limit = maxOutputRead
	}
	b64, err := queryEncoding(r)
	if err != nil {
		return err
	}
	buf := p.Output(idx)
	data, start, dropped, err := buf.Read(off, int(limit))
	if err != nil {
		return api.BadRequest("%v", err)
	}
	fin := p.Finished() // checked after the read: if true, total below is final
	total, _, _ := buf.State()
	end := start + int64(len(data))
	eof := fin && end == total
	if !b64 && !eof {
		data = data[:completeUTF8(data)]
		end = start + int64(len(data))
	}
	api.WriteJSON(w, http.StatusOK, OutputResult{
		Stream: stream, Offset: start, NextOffset: end, Data: encode(data, b64),
		Encoding: encodingName(b64), EOF: eof, Dropped: dropped,
	})
	return nil
}

// procFollow streams output from the given offsets as NDJSON, live, then
// the exit line; a client that lost its connection resumes from the last
// offsets it saw.
func procFollow(w http.ResponseWriter, r *http.Request, p *proc.Proc) error {
	b64, err := queryEncoding(r)
	if err != nil {
		return err
	}
	streams := 2
	if p.PTY() {
		streams = 1
	}
	var pos [2]int64
	for i, name := range []string{"stdout_offset", "stderr_offset"} {
		if pos[i], err = queryInt(r, name, 0); err != nil {
			return err
		}
		if total, _, _ := p.Output(i).State(); pos[i] > total {
			return api.BadRequest("%s %d is past the end of the stream (%d)", name, pos[i], total)
		}
	}
	out := newNDJSON(w)
	chunkers := []*textChunker{
		{stream: "stdout", b64: b64, offset: pos[0]},
		{stream: "stderr", b64: b64, offset: pos[1]},
	}
	for {
		var wake [2]<-chan struct{}
		fin := p.Finished()
		atEnd := true
		for i := 0; i < streams; i++ {
			buf := p.Output(i)
			total, _, changed := buf.State()
			wake[i] = changed
			for pos[i] < total {
				data, start, dropped, err := buf.Read(pos[i], 64<<10)
				if err != nil || len(data) == 0 {
					pos[i] = total // unreadable (the process was deleted): nothing more to send
					break
				}
				if dropped {
					flushChunkers(out, chunkers[i])
					chunkers[i].offset = start
				}
				pos[i] = start + int64(len(data))
				if ev := chunkers[i].chunk(data, false); ev != nil {
					out.send(ev)
				}
			}
			if pos[i] < total {
				atEnd = false
			}
		}
		if fin && atEnd {
			break
		}
		select {
		case <-wake[0]:
		case <-wake[1]:
		case <-p.Done():
		case <-r.Context().Done():
			return nil
		}
	}
	flushChunkers(out, chunkers[:streams]...)
	in := p.Info()
	ev := ExitEvent{Type: "exit", TimedOut: in.TimedOut, Signal: in.Signal}
	if in.ExitCode != nil {
		ev.ExitCode = *in.ExitCode
	}
	if in.EndedAt != nil {
		ev.DurationS = *in.EndedAt - in.StartedAt
	}
	out.send(ev)
	return nil
}
