package agentd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/materialize"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/process"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/userdb"
)

// accounts creates the sandbox's users and groups for materialization:
// with groupadd/useradd when the image has them (and the daemon manages the
// real /etc), else by editing etc/passwd and etc/group itself.
type accounts struct{ d *Daemon }

var _ materialize.Accounts = accounts{}

// tool returns the path of an account tool, or "" when the fallback applies.
func (a accounts) tool(name string) string {
	if filepath.Clean(a.d.cfg.EtcRoot) != "/" {
		return ""
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// needRoot refuses account changes a non-root daemon cannot make.
func needRoot(what string) error {
	if os.Geteuid() != 0 {
		return errkind.Errorf(errkind.ErrFailedPrecondition, "cannot create %s: the daemon does not run as root (use a sandbox where it does, such as a container)", what)
	}
	return nil
}

// EnsureGroup creates a group when missing.
func (a accounts) EnsureGroup(ctx context.Context, g materialize.Group) (bool, error) {
	if _, err := a.d.users.GroupID(g.Name); err == nil {
		return false, nil
	} else if !errors.Is(err, errkind.ErrNotFound) {
		return false, err
	}
	if err := needRoot("group " + g.Name); err != nil {
		return false, err
	}
	if tool := a.tool("groupadd"); tool != "" {
		argv := []string{tool}
		if g.GID != nil {
			argv = append(argv, "-g", strconv.FormatUint(uint64(*g.GID), 10))
		}
		return true, a.run(ctx, append(argv, g.Name))
	}
	_, err := a.d.users.AddGroup(userdb.NewGroup{Name: g.Name, GID: g.GID})
	return err == nil, err
}

// EnsureUser creates a user (and its private group) when missing.
func (a accounts) EnsureUser(ctx context.Context, u materialize.User) (bool, error) {
	if existing, err := a.d.users.Lookup(u.Name); err == nil && existing.Name == u.Name {
		return false, nil
	} else if err != nil && !errors.Is(err, errkind.ErrNotFound) {
		return false, err
	}
	if err := needRoot("user " + u.Name); err != nil {
		return false, err
	}
	if tool := a.tool("useradd"); tool != "" {
		argv := []string{tool, "--create-home", "--user-group"}
		if u.UID != nil {
			argv = append(argv, "--uid", strconv.FormatUint(uint64(*u.UID), 10))
		}
		if len(u.Groups) > 0 {
			argv = append(argv, "--groups", strings.Join(u.Groups, ","))
		}
		if u.Home != "" {
			argv = append(argv, "--home-dir", u.Home)
		}
		if u.Shell != "" {
			argv = append(argv, "--shell", u.Shell)
		}
		return true, a.run(ctx, append(argv, u.Name))
	}
	_, err := a.d.users.AddUser(userdb.NewUser{Name: u.Name, UID: u.UID, Groups: u.Groups, Home: u.Home, Shell: u.Shell})
	return err == nil, err
}

// IDs resolves an entry's owner.
func (a accounts) IDs(user, group string) (uint32, uint32, error) {
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	if user != "" {
		u, err := a.d.users.Lookup(user)
		if err != nil {
			return 0, 0, fmt.Errorf("owner: %w", err)
		}
		uid, gid = u.UID, u.GID
	}
	if group != "" {
		g, err := a.d.users.GroupID(group)
		if err != nil {
			return 0, 0, fmt.Errorf("group: %w", err)
		}
		gid = g
	}
	return uid, gid, nil
}

// run runs an account tool through the process engine (the daemon reaps
// every child, so os/exec's Wait cannot be used) as the daemon's own user.
func (a accounts) run(ctx context.Context, argv []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	info, err := a.d.procs.Start(ctx, process.StartOptions{
		Argv: argv, User: strconv.Itoa(os.Geteuid()), Dir: "/", HoldOutput: true,
		Env: map[string]string{"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, Timeout: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(argv[0]), err)
	}
	st, err := a.d.procs.Wait(ctx, info.ID)
	if err != nil {
		_ = a.d.procs.Signal(info.ID, "KILL")
		return fmt.Errorf("%s: %w", filepath.Base(argv[0]), err)
	}
	if st.Code != 0 {
		out, _ := a.d.procs.Read(ctx, info.ID, 0, 0, 4096)
		var b strings.Builder
		for _, c := range out.Chunks {
			b.Write(c.Data)
		}
		msg := strings.TrimSpace(b.String())
		return errkind.Errorf(errkind.ErrFailedPrecondition, "%s exited with %d: %s", filepath.Base(argv[0]), st.Code, msg)
	}
	return nil
}
