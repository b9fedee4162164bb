package main

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// mount is one line of /proc/<pid>/mountinfo (proc(5)).
type mount struct {
	point   string              // where, relative to the process's root
	fstype  string              // e.g. overlay
	options map[string][]string // the filesystem's own options; a repeated one keeps each value
}

// readMountinfo parses a mountinfo file: the mounts a process sees, in its own namespace.
func readMountinfo(file string) ([]mount, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20) // many-layer lowerdirs make long lines
	for sc.Scan() {
		m, err := parseMountLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// parseMountLine reads "id parent maj:min root point opts [optional...] - fstype source super".
func parseMountLine(line string) (mount, error) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 7 || sep < 0 || sep+2 >= len(fields) {
		return mount{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	m := mount{point: unescape(fields[4]), fstype: fields[sep+1], options: map[string][]string{}}
	if sep+3 < len(fields) {
		for _, opt := range strings.Split(fields[sep+3], ",") {
			k, v, _ := strings.Cut(opt, "=")
			m.options[k] = append(m.options[k], unescape(v))
		}
	}
	return m, nil
}

// unescape undoes the kernel's octal escapes (\040 for a space, \054 for a comma, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// overlayRoot is what a container's root filesystem is made of: the writable upper dir
// and the image's layers (top first), as host paths.
type overlayRoot struct {
	upper  string
	lowers []string
	points map[string]bool // the other mount points, exactly (not their parents)
}

// rootOverlay finds the overlay mounted at the process's "/" and the other mount points
// (and their parents): the runtime's bind mounts, which leave empty stand-ins in the
// upper dir that are never a change of the sandbox's.
func rootOverlay(mounts []mount) (overlayRoot, map[string]bool, error) {
	var root *mount
	hidden, points := map[string]bool{}, map[string]bool{}
	for i := range mounts {
		m := &mounts[i]
		if m.point == "/" {
			root = m // a later mount over "/" wins, as it hides the earlier one
			continue
		}
		points[path.Clean("/"+m.point)] = true
		for p := path.Clean("/" + m.point); p != "/"; p = path.Dir(p) {
			hidden[p] = true
		}
	}
	if root == nil || root.fstype != "overlay" {
		return overlayRoot{}, nil, fail(501, "not_overlay",
			"the container's root is not an overlay mount (another snapshotter or runtime?)")
	}
	upper := last(root.options["upperdir"])
	if upper == "" {
		return overlayRoot{}, nil, fail(501, "not_overlay", "the container's root overlay has no upper dir")
	}
	var lowers []string
	for _, l := range root.options["lowerdir"] {
		lowers = append(lowers, splitLower(l)...)
	}
	lowers = append(lowers, root.options["lowerdir+"]...)
	// containerd shortens a long lowerdir list to paths relative to its snapshots folder
	// (it mounts from there): upper is <snapshots>/<n>/fs.
	base := filepath.Dir(filepath.Dir(upper))
	for i, l := range lowers {
		if !filepath.IsAbs(l) {
			lowers[i] = filepath.Join(base, l)
		}
	}
	return overlayRoot{upper: upper, lowers: lowers, points: points}, hidden, nil
}

// splitLower splits "a:b:c" (top first); "\:" is a colon inside a path, and "::" starts
// the data-only layers, which hold file data but no names and so take part in no diff.
func splitLower(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ':':
			if cur.Len() == 0 { // "::": the rest are data-only layers
				return out
			}
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func last(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}
