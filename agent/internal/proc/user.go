package proc

import (
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// DefaultPath is the PATH a command is looked up in when its environment has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ExecFailed is the 422 for a program that could not be started.
func ExecFailed(format string, args ...any) error {
	return api.Errf(http.StatusUnprocessableEntity, "exec_failed", format, args...)
}

// LookPath finds file in the PATH the child will see (not the agent's).
func LookPath(file string, env []string, dir string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil // execve reports what is wrong with it
	}
	pathEnv := DefaultPath
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			pathEnv = kv[len("PATH="):]
		}
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		check := p
		if !filepath.IsAbs(p) && dir != "" {
			check = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(check); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			if !filepath.IsAbs(p) {
				p = "./" + p
			}
			return p, nil
		}
	}
	return "", ExecFailed("%s: executable file not found in PATH", file)
}

// MergeEnv returns base with the variables in add set (replacing any earlier value).
func MergeEnv(base []string, add map[string]string) []string {
	if len(add) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(add))
	for _, kv := range base {
		k := kv
		if i := strings.IndexByte(kv, '='); i >= 0 {
			k = kv[:i]
		}
		if _, ok := add[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range add {
		out = append(out, k+"="+v)
	}
	return out
}

// ScrubbedEnv is the agent's environment without its own settings, so no
// child ever sees the token.
func ScrubbedEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "ORCHARD_AGENT_") {
			out = append(out, kv)
		}
	}
	return out
}

// ResolveUser parses "uid[:gid]" or "name[:group]" (names from /etc/passwd
// and /etc/group; os/user reads them in pure Go) into credentials, plus
// HOME/USER/LOGNAME when the user is known.
func ResolveUser(spec string) (*syscall.Credential, map[string]string, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	var u *user.User
	var err error
	if _, convErr := strconv.ParseUint(name, 10, 32); convErr == nil {
		u, err = user.LookupId(name)
		if err != nil {
			u = &user.User{Uid: name, Gid: name}
		}
	} else if u, err = user.Lookup(name); err != nil {
		return nil, nil, api.BadRequest("unknown user %q", name)
	}
	gid := u.Gid
	if hasGroup {
		if _, convErr := strconv.ParseUint(group, 10, 32); convErr == nil {
			gid = group
		} else if g, err := user.LookupGroup(group); err == nil {
			gid = g.Gid
		} else {
			return nil, nil, api.BadRequest("unknown group %q", group)
		}
	}
	uid64, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid64, err := strconv.ParseUint(gid, 10, 32)
	if err != nil {
		return nil, nil, api.BadRequest("bad gid %q for user %q", gid, spec)
	}
	cred := &syscall.Credential{Uid: uint32(uid64), Gid: uint32(gid64), Groups: []uint32{}}
	if !hasGroup && u.Username != "" {
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if n, err := strconv.ParseUint(id, 10, 32); err == nil && uint32(n) != cred.Gid {
					cred.Groups = append(cred.Groups, uint32(n))
				}
			}
		}
	}
	if os.Geteuid() != 0 {
		cred.NoSetGroups = true // only root may call setgroups
	}
	env := map[string]string{}
	if u.Username != "" {
		env["USER"], env["LOGNAME"] = u.Username, u.Username
	}
	if u.HomeDir != "" {
		env["HOME"] = u.HomeDir
	}
	return cred, env, nil
}
