package files

import (
	"net/http"
	"strconv"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// Bounds on what one tar upload writes (issue 17, hole 8): a 2 MB gzip stream can
// expand to 2 GiB, so the compressed size the service limits says little.
const (
	DefaultMaxTarBytes   int64 = 1 << 30   // regular files' content, summed
	DefaultMaxTarEntries int64 = 1_000_000 // every entry, folders and links included
)

type tarLimits struct{ bytes, entries int64 }

// uploadLimits reads the limits of one upload. A header (X-Orchard-Max-Bytes,
// X-Orchard-Max-Entries) replaces the default: the service sets it, the operator's
// limit, and sends no caller's headers to the agent. A query parameter (max_bytes,
// max_entries), which the caller controls, may only lower the limit.
func uploadLimits(r *http.Request) (tarLimits, error) {
	l := tarLimits{bytes: DefaultMaxTarBytes, entries: DefaultMaxTarEntries}
	for _, f := range []struct {
		header, query string
		v             *int64
	}{
		{"X-Orchard-Max-Bytes", "max_bytes", &l.bytes},
		{"X-Orchard-Max-Entries", "max_entries", &l.entries},
	} {
		if h := r.Header.Get(f.header); h != "" {
			n, err := strconv.ParseInt(h, 10, 64)
			if err != nil || n < 0 {
				return l, api.BadRequest("%s: %q is not a non-negative integer", f.header, h)
			}
			*f.v = n
		}
		n, err := queryInt(r, f.query, -1)
		if err != nil {
			return l, err
		}
		if n >= 0 && n < *f.v {
			*f.v = n
		}
	}
	return l, nil
}

// tooLarge is the 413 for an upload past its limits; extraction stops there.
func tooLarge(format string, args ...any) *api.Error {
	return api.Errf(http.StatusRequestEntityTooLarge, "upload_too_large", format, args...)
}
