package manager

// Request policy. Every field of every call is untrusted input, checked
// before anything is created by the same policy as an untrusted manifest
// (DESIGN: "Every field of a service request is untrusted input"), here in
// the manager so a Go embedder's callers are held to it as much as the
// network's. A refusal is a *FieldError (invalid argument) and its message
// starts with the field's name, as the wire spells it ("agent.run_as:
// ...", "workdir: ...", "manifest: users[0].uid: ...").
//
// Accounts. A request's agent runs as a sandbox account the request's own
// manifest declares, or as the sandbox's own account (leave agent.run_as
// and the manifest's run_as empty, or name compute.DefaultRunAsName): never
// root, never an account the manifest does not declare (the service used to
// declare it on the fly, so a tenant could pick any name, an image's system
// accounts included), and never a system account's name (daemon, bin,
// nobody, shadow, disk, ...: a sandbox image's existing account is reused
// as it is, with its uid and its groups). A request's manifest cannot fix
// numeric uids or gids (the sandbox picks them, so a tenant cannot take a
// host or image id), and its users' homes are below /home or the workspace
// (a home elsewhere would be made the user's: /etc, say).

import (
	"fmt"
	"path"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Bounds of request fields.
const (
	// maxInputBytes bounds a run's task (StartRunRequest.input).
	maxInputBytes = 1 << 20
	// maxInstructionsBytes bounds agent.instructions.
	maxInstructionsBytes = 256 << 10
	// maxNameBytes bounds names: agent.name, agent.model, tool names,
	// capability names, agent.run_as.
	maxNameBytes = 128
	// maxApprovalNames bounds approvals.require_approval.
	maxApprovalNames = 64
	// maxAllowedCommands bounds approvals.allowed_commands; each pattern
	// is at most maxPatternBytes long and compiles to at most
	// maxPatternInsts instructions (Go's regexp matches in linear time;
	// this bounds the program it runs on every command).
	maxAllowedCommands = 32
	maxPatternBytes    = 1024
	maxPatternInsts    = 5000
	// maxWorkdirBytes bounds workdir; maxPathBytes sandbox file paths.
	maxWorkdirBytes = 1024
	maxPathBytes    = 4096
	// maxCallIDBytes bounds an approval's call_id; maxReasonBytes its
	// reason and a cancel's reason (shown to the model, kept in events).
	maxCallIDBytes = 256
	maxReasonBytes = 4096
	// maxPageTokenBytes bounds ListRuns' page_token; maxPageSize its
	// page_size.
	maxPageTokenBytes = 256
	maxPageSize       = 500
	// maxIDDigits bounds the part of a run or sandbox id after its prefix.
	maxIDDigits = 64
	// maxTerminalSize bounds a terminal's rows and columns.
	maxTerminalSize = 1000
	// maxTerminalArgs and maxTerminalArgvBytes bound a terminal's command.
	maxTerminalArgs      = 256
	maxTerminalArgvBytes = 64 << 10
)

// checkText refuses text that is too long or holds NUL bytes (protobuf
// strings are UTF-8 already; NUL would be cut by C-string consumers).
func checkText(field, s string, maxBytes int) error {
	if len(s) > maxBytes {
		return badField(field, "%d bytes; the limit is %d", len(s), maxBytes)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return badField(field, "contains a NUL byte")
	}
	if !utf8.ValidString(s) {
		return badField(field, "is not valid UTF-8")
	}
	return nil
}

// checkName refuses a name that is too long or holds control characters.
func checkName(field, s string) error {
	if err := checkText(field, s, maxNameBytes); err != nil {
		return err
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return badField(field, "contains a control character")
		}
	}
	return nil
}

// checkID checks a run or sandbox id: prefix then 1 to maxIDDigits
// lower-case letters and digits. Empty is refused as missing.
func checkID(field, id, prefix string) error {
	if id == "" {
		return badField(field, "missing")
	}
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || rest == "" || len(rest) > maxIDDigits {
		return badField(field, "%q is not a %s id", clip(id), strings.TrimSuffix(prefix, "-"))
	}
	for _, c := range []byte(rest) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return badField(field, "%q is not a %s id", clip(id), strings.TrimSuffix(prefix, "-"))
		}
	}
	return nil
}

// checkRunID checks a run id field.
func checkRunID(field, id string) error { return checkID(field, id, "run-") }

// checkSandboxID checks a sandbox id field.
func checkSandboxID(field, id string) error { return checkID(field, id, "sbx-") }

// checkSnapshotID checks a snapshot id field.
func checkSnapshotID(field, id string) error { return checkID(field, id, "snap-") }

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// reservedAccounts are the names of the system users and groups of common
// images (Debian and Ubuntu base-passwd, Alpine and busybox, RHEL and
// Fedora): a request's manifest cannot declare them, nor run as them,
// because a sandbox reuses an existing account as it is. Names starting
// with "_" or "systemd-" are reserved as well.
var reservedAccounts = map[string]bool{
	"root": true, "daemon": true, "bin": true, "sys": true, "sync": true, "games": true, "man": true, "lp": true,
	"mail": true, "news": true, "uucp": true, "proxy": true, "www-data": true, "backup": true, "list": true,
	"irc": true, "gnats": true, "nobody": true, "nogroup": true, "adm": true, "tty": true, "disk": true,
	"kmem": true, "dialout": true, "fax": true, "voice": true, "cdrom": true, "floppy": true, "tape": true,
	"sudo": true, "audio": true, "dip": true, "operator": true, "src": true, "shadow": true, "utmp": true,
	"video": true, "sasl": true, "plugdev": true, "staff": true, "users": true, "input": true, "kvm": true,
	"render": true, "sgx": true, "crontab": true, "messagebus": true, "sshd": true, "ssh": true, "wheel": true,
	"admin": true, "docker": true, "lxd": true, "halt": true, "shutdown": true, "ftp": true, "postfix": true,
	"postdrop": true, "polkitd": true, "netdev": true, "ping": true, "abuild": true, "at": true, "cron": true,
	"squid": true, "xfs": true, "smmsp": true, "mem": true, "guest": true, "ntp": true, "chrony": true,
	"dbus": true, "tss": true, "libvirt": true, "lock": true,
}

// reservedAccount reports whether a request may not declare or run as name.
func reservedAccount(name string) bool {
	return reservedAccounts[name] || strings.HasPrefix(name, "_") || strings.HasPrefix(name, "systemd-")
}

// checkAccounts applies the service's account policy (see the top of this
// file) to a request's parsed manifest.
func checkAccounts(m *manifest.Manifest) error {
	for i, g := range m.Groups {
		fp := fmt.Sprintf("manifest: groups[%d]", i)
		if reservedAccount(g.Name) {
			return badField(fp+".name", "%q is a system account's name; declare a group of another name", g.Name)
		}
		if g.GID != nil {
			return badField(fp+".gid", "a request's manifest cannot fix a group id (the sandbox picks it)")
		}
	}
	for i, u := range m.Users {
		fp := fmt.Sprintf("manifest: users[%d]", i)
		if reservedAccount(u.Name) {
			return badField(fp+".name", "%q is a system account's name; declare a user of another name", u.Name)
		}
		if u.UID != nil {
			return badField(fp+".uid", "a request's manifest cannot fix a user id (uid %d): the sandbox picks it", *u.UID)
		}
		if u.Home != "" && !homeAllowed(u.Home, m.WorkspaceRoot()) {
			return badField(fp+".home", "%q: a home must be below /home or the workspace %s", u.Home, m.WorkspaceRoot())
		}
	}
	return nil
}

// homeAllowed reports whether home is strictly below /home or root.
func homeAllowed(home, root string) bool {
	h := path.Clean(home)
	if h != home {
		return false
	}
	for _, base := range []string{"/home", root} {
		if strings.HasPrefix(h, strings.TrimSuffix(base, "/")+"/") {
			return true
		}
	}
	return false
}

// resolveRunAs applies a request's agent.run_as to its sandbox manifest m
// and returns the manifest the sandbox is made from (see the top of this
// file): "" keeps the manifest's run_as (or the sandbox's own account when
// it names none), compute.DefaultRunAsName asks for the sandbox's own
// account, any other name must be a user m declares.
func resolveRunAs(m *manifest.Manifest, runAs string) (*manifest.Manifest, error) {
	const field = "agent.run_as"
	switch {
	case runAs == "":
		return m, nil
	case runAs == "root":
		return nil, badField(field, "a request's agent cannot run as root; leave run_as empty for the sandbox's own account")
	case reservedAccount(runAs):
		return nil, badField(field, "%q is a system account's name; run as a user the manifest declares, or leave run_as empty", clip(runAs))
	}
	if err := checkName(field, runAs); err != nil {
		return nil, err
	}
	for _, u := range m.Users {
		if u.Name == runAs {
			if m.RunAs == runAs {
				return m, nil
			}
			out := m.Clone()
			out.RunAs = runAs
			return out, nil
		}
	}
	if runAs == compute.DefaultRunAsName {
		// The sandbox's own account (the provider declares it).
		out := m.Clone()
		out.RunAs = ""
		return out, nil
	}
	return nil, badField(field, "user %q is not declared in the manifest's users; declare it there, or leave run_as empty for the sandbox's own account", clip(runAs))
}

// checkCallerSandbox checks a spec naming the caller's sandbox (Sandbox):
// a sandbox id, with no manifest (the sandbox has its workspace already)
// and no agent.run_as (the run works as the sandbox's account).
func checkCallerSandbox(spec *RunSpec) error {
	if spec.Sandbox == "" {
		return nil
	}
	if err := checkSandboxID("sandbox_id", spec.Sandbox); err != nil {
		return err
	}
	if spec.Manifest != "" {
		return badField("manifest", "must be empty with sandbox_id: the sandbox has its workspace already")
	}
	if spec.Agent.RunAs != "" {
		return badField("agent.run_as", "must be empty with sandbox_id: the run works as the sandbox's account")
	}
	return nil
}

// checkWorkdir checks a workspace-relative directory.
func checkWorkdir(field, wd string) error {
	if err := checkText(field, wd, maxWorkdirBytes); err != nil {
		return err
	}
	if strings.HasPrefix(wd, "/") {
		return badField(field, "%q: must be relative to the workspace root", clip(wd))
	}
	for _, part := range strings.Split(wd, "/") {
		if part == ".." {
			return badField(field, "%q: must not contain \"..\"", clip(wd))
		}
	}
	return nil
}

// checkApprovals checks an approval policy and compiles its patterns.
func checkApprovals(p ApprovalPolicy) ([]*regexp.Regexp, error) {
	names := p.RequireApproval
	if len(names) > maxApprovalNames {
		return nil, badField("approvals.require_approval", "%d names; the limit is %d", len(names), maxApprovalNames)
	}
	for i, n := range names {
		field := fmt.Sprintf("approvals.require_approval[%d]", i)
		if n == "" {
			return nil, badField(field, "empty tool name")
		}
		if err := checkName(field, n); err != nil {
			return nil, err
		}
	}
	cmds := p.AllowedCommands
	if len(cmds) > maxAllowedCommands {
		return nil, badField("approvals.allowed_commands", "%d patterns; the limit is %d", len(cmds), maxAllowedCommands)
	}
	var res []*regexp.Regexp
	for i, c := range cmds {
		field := fmt.Sprintf("approvals.allowed_commands[%d]", i)
		if err := checkText(field, c, maxPatternBytes); err != nil {
			return nil, err
		}
		re, err := compilePattern(c)
		if err != nil {
			return nil, badField(field, "%v", err)
		}
		res = append(res, re)
	}
	return res, nil
}

// compilePattern compiles a regular expression whose program is at most
// maxPatternInsts instructions ((\w+\s+\w+){1000} is 17 bytes of text but
// 8,000 instructions).
func compilePattern(expr string) (*regexp.Regexp, error) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	if n := len(prog.Inst); n > maxPatternInsts {
		return nil, fmt.Errorf("the pattern compiles to %d instructions; the limit is %d", n, maxPatternInsts)
	}
	return regexp.Compile(expr)
}

// checkModel refuses a model the manager does not offer.
func (m *Manager) checkModel(name string) error {
	if name == "" || name == m.cfg.DefaultModel {
		return nil
	}
	if err := checkName("agent.model", name); err != nil {
		return err
	}
	for _, n := range m.cfg.Models {
		if n == name {
			return nil
		}
	}
	offered := append([]string{m.cfg.DefaultModel}, m.cfg.Models...)
	return badField("agent.model", "%q is not offered by this service (offered: %s)", clip(name), strings.Join(offered, ", "))
}

// checkAgent checks an AgentSpec (the model, names, sizes; run_as is
// checked against the manifest by checkSpec).
func (m *Manager) checkAgent(a AgentSpec) error {
	if err := checkName("agent.name", a.Name); err != nil {
		return err
	}
	if err := checkText("agent.instructions", a.Instructions, maxInstructionsBytes); err != nil {
		return err
	}
	if err := m.checkModel(a.Model); err != nil {
		return err
	}
	if len(a.Capabilities) > len(capabilityNames) {
		return badField("agent.capabilities", "%d names; there are %d capabilities", len(a.Capabilities), len(capabilityNames))
	}
	if _, err := capabilitiesOf(a.Capabilities); err != nil {
		return &FieldError{Field: "agent.capabilities", Err: err}
	}
	return nil
}

// validateSpec checks a run's spec before anything is created and
// returns the manifest its sandbox is made from.
func (m *Manager) validateSpec(spec *RunSpec, needInput bool) (*manifest.Manifest, error) {
	if err := checkText("input", spec.Input, maxInputBytes); err != nil {
		return nil, err
	}
	if needInput && strings.TrimSpace(spec.Input) == "" {
		return nil, badField("input", "the run needs a task")
	}
	if spec.MaxTurns < 0 {
		return nil, badField("max_turns", "must not be negative")
	}
	if err := m.checkAgent(spec.Agent); err != nil {
		return nil, err
	}
	if _, err := checkApprovals(spec.Approvals); err != nil {
		return nil, err
	}
	if err := checkWorkdir("workdir", spec.Workdir); err != nil {
		return nil, err
	}
	if err := checkCallerSandbox(spec); err != nil {
		return nil, err
	}
	man, err := sandboxManifest(spec)
	if err != nil {
		return nil, err
	}
	if m.cfg.CheckManifest != nil {
		if err := m.cfg.CheckManifest(man); err != nil {
			return nil, manifestErr(err)
		}
	}
	return man, nil
}

// checkCallID checks an approval's call id.
func checkCallID(id string) error {
	if id == "" {
		return badField("call_id", "missing")
	}
	if err := checkName("call_id", id); err != nil || len(id) > maxCallIDBytes {
		return badField("call_id", "not a call id")
	}
	return nil
}

// checkListOptions checks ListRuns' options and returns the stored status
// to filter on ("" for all).
func checkListOptions(o ListRunsOptions) (string, error) {
	if o.PageSize < 0 || o.PageSize > maxPageSize {
		return "", badField("page_size", "must be between 0 and %d", maxPageSize)
	}
	if tok := o.PageToken; len(tok) > maxPageTokenBytes || strings.ContainsFunc(tok, func(r rune) bool {
		return !(r == '.' || r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
	}) {
		return "", badField("page_token", "not a page token of this service")
	}
	if o.Status == "" {
		return "", nil
	}
	st := storedStatus(o.Status)
	if st == "" {
		return "", badField("status", "unknown run status %q", clip(string(o.Status)))
	}
	return st, nil
}

// cleanPath checks a workspace-relative path ("" is the root). The daemon
// confines paths itself; this gives a clear error first.
func cleanPath(p string) (string, error) {
	if err := checkText("path", p, maxPathBytes); err != nil {
		return "", err
	}
	p = strings.TrimPrefix(p, "/")
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", badField("path", "%q: .. is not allowed", clip(p))
	}
	if p == "" {
		return ".", nil
	}
	return p, nil
}

// checkTerminal checks a terminal's sandbox and options.
func checkTerminal(sandboxID string, o TerminalOptions) error {
	if err := checkSandboxID("start.sandbox_id", sandboxID); err != nil {
		return err
	}
	if o.Cols > maxTerminalSize || o.Rows > maxTerminalSize {
		return badField("start", "%dx%d: cols and rows are at most %d", o.Cols, o.Rows, maxTerminalSize)
	}
	argv := o.Command
	if len(argv) > maxTerminalArgs {
		return badField("start.command", "%d arguments; the limit is %d", len(argv), maxTerminalArgs)
	}
	total := 0
	for i, a := range argv {
		total += len(a)
		if err := checkText(fmt.Sprintf("start.command[%d]", i), a, maxTerminalArgvBytes); err != nil {
			return err
		}
	}
	if total > maxTerminalArgvBytes {
		return badField("start.command", "%d bytes; the limit is %d", total, maxTerminalArgvBytes)
	}
	if len(argv) > 0 && argv[0] == "" {
		return badField("start.command[0]", "empty program")
	}
	return nil
}

// checkTerminalSize checks a resize.
func checkTerminalSize(sz TerminalSize) error {
	if sz.Cols == 0 || sz.Rows == 0 || sz.Cols > maxTerminalSize || sz.Rows > maxTerminalSize {
		return badField("resize", "%dx%d: cols and rows are between 1 and %d", sz.Cols, sz.Rows, maxTerminalSize)
	}
	return nil
}

// Bounds of the sandbox API's fields (sandboxes made through the API,
// commands, files).
const (
	// maxLabels bounds a sandbox's labels; maxLabelKeyBytes a key (a
	// Kubernetes label name's length) and maxLabelValueBytes a value.
	maxLabels          = 32
	maxLabelKeyBytes   = 63
	maxLabelValueBytes = 256
	// maxCommandBytes bounds a command line, and argv's total bytes;
	// maxArgs argv's length.
	maxCommandBytes = 64 << 10
	maxArgs         = 1024
	// maxEnvVars and maxEnvBytes bound a command's environment; a name
	// is at most maxEnvNameBytes.
	maxEnvVars      = 128
	maxEnvNameBytes = 256
	maxEnvBytes     = 256 << 10
	// maxStdinBytes bounds the stdin bytes of one call.
	maxStdinBytes = 8 << 20
	// maxPatchBytes bounds a patch's text.
	maxPatchBytes = 8 << 20
	// maxProcessIDBytes bounds a process id.
	maxProcessIDBytes = 128
	// maxOutputWait bounds how long ReadProcessOutput waits for output.
	maxOutputWait = 30 * time.Second
)

// labelKey is the syntax of a label's key.
var labelKey = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?$`)

// checkLabels checks labels (a sandbox's, or a filter's).
func checkLabels(field string, labels map[string]string) error {
	if len(labels) > maxLabels {
		return badField(field, "%d labels; the limit is %d", len(labels), maxLabels)
	}
	for k, v := range labels {
		if len(k) > maxLabelKeyBytes || !labelKey.MatchString(k) {
			return badField(field, "key %q: 1 to %d bytes of a-z, 0-9, '.', '_', '-', '/', starting and ending with a letter or digit",
				clip(k), maxLabelKeyBytes)
		}
		if err := checkName(field+"["+k+"]", v); err != nil || len(v) > maxLabelValueBytes {
			return badField(field+"["+k+"]", "values are at most %d bytes of text without control characters", maxLabelValueBytes)
		}
	}
	return nil
}

// bounded is a duration field: 0 takes def; negative, or more than max,
// is refused; less than min too.
func bounded(field string, d, def, least, most time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return def, nil
	case d < 0:
		return 0, badField(field, "must not be negative")
	case d < least:
		return 0, badField(field, "%s; the least is %s", d, least)
	case d > most:
		return 0, badField(field, "%s; the limit is %s", d, most)
	}
	return d, nil
}

// checkCommand checks a command's fields but its user (resolveUser checks
// it against the sandbox's manifest).
func checkCommand(c CommandSpec) error {
	switch {
	case c.Command == "" && len(c.Argv) == 0:
		return badField("command", "missing: give command or argv")
	case c.Command != "" && len(c.Argv) > 0:
		return badField("argv", "give command or argv, not both")
	}
	if err := checkText("command", c.Command, maxCommandBytes); err != nil {
		return err
	}
	if len(c.Argv) > maxArgs {
		return badField("argv", "%d arguments; the limit is %d", len(c.Argv), maxArgs)
	}
	total := 0
	for i, a := range c.Argv {
		total += len(a)
		if err := checkText(fmt.Sprintf("argv[%d]", i), a, maxCommandBytes); err != nil {
			return err
		}
	}
	if total > maxCommandBytes {
		return badField("argv", "%d bytes; the limit is %d", total, maxCommandBytes)
	}
	if len(c.Argv) > 0 && c.Argv[0] == "" {
		return badField("argv[0]", "empty program")
	}
	if err := checkWorkdir("cwd", c.Cwd); err != nil {
		return err
	}
	if len(c.Env) > maxEnvVars {
		return badField("env", "%d variables; the limit is %d", len(c.Env), maxEnvVars)
	}
	total = 0
	for k, v := range c.Env {
		total += len(k) + len(v)
		if k == "" || len(k) > maxEnvNameBytes || strings.ContainsFunc(k, func(r rune) bool {
			return !(r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
		}) || (k[0] >= '0' && k[0] <= '9') {
			return badField("env", "%q is not a variable name (letters, digits and '_', not starting with a digit)", clip(k))
		}
		if err := checkText("env["+k+"]", v, maxEnvBytes); err != nil {
			return err
		}
	}
	if total > maxEnvBytes {
		return badField("env", "%d bytes; the limit is %d", total, maxEnvBytes)
	}
	if len(c.Stdin) > maxStdinBytes {
		return badField("stdin", "%d bytes; the limit is %d", len(c.Stdin), maxStdinBytes)
	}
	return nil
}

// resolveUser is the account a call runs as in a sandbox made from man:
// "" is the manifest's run_as (the sandbox's own account when it names
// none); any other name must be a user man declares (the sandbox's own
// account is one), never root nor a system account's name: the run_as
// policy of requests (resolveRunAs).
func resolveUser(man *manifest.Manifest, user string) (string, error) {
	const field = "user"
	switch {
	case user == "":
		return man.RunAs, nil
	case user == "root":
		return "", badField(field, "a request cannot run as root; leave user empty for the sandbox's own account")
	case reservedAccount(user):
		return "", badField(field, "%q is a system account's name; run as a user the manifest declares, or leave user empty", clip(user))
	}
	if err := checkName(field, user); err != nil {
		return "", err
	}
	for _, u := range man.Users {
		if u.Name == user {
			return user, nil
		}
	}
	if user == compute.DefaultRunAsName && man.RunAs == "" {
		return "", nil
	}
	return "", badField(field, "user %q is not declared in the sandbox's manifest", clip(user))
}

// checkProcessID checks a process id field.
func checkProcessID(id string) error {
	if id == "" {
		return badField("process_id", "missing")
	}
	if len(id) > maxProcessIDBytes || strings.ContainsFunc(id, func(r rune) bool {
		return !(r == '.' || r == '-' || r == '_' || r == ':' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
	}) {
		return badField("process_id", "%q is not a process id", clip(id))
	}
	return nil
}

// signals are the signals a request may send.
var signals = map[string]bool{"SIGTERM": true, "SIGKILL": true, "SIGINT": true, "SIGHUP": true, "SIGQUIT": true,
	"SIGUSR1": true, "SIGUSR2": true, "SIGSTOP": true, "SIGCONT": true}

// checkSignal returns a signal field's name with its SIG prefix.
func checkSignal(sig string) (string, error) {
	s := strings.ToUpper(sig)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	if !signals[s] {
		return "", badField("signal", "%q is not one of SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT", clip(sig))
	}
	return s, nil
}

// checkMode checks permission bits (no setuid, setgid or sticky bit).
func checkMode(field string, mode uint32) error {
	if mode > 0o777 {
		return badField(field, "%#o: permission bits are at most 0777", mode)
	}
	return nil
}

// filePath is a workspace-relative path that must name something below
// the root (cleanPath's "" is the root itself).
func filePath(p string) (string, error) {
	c, err := cleanPath(p)
	if err != nil {
		return "", err
	}
	if c == "." || strings.Trim(c, "/.") == "" {
		return "", badField("path", "missing: name a path below the workspace root")
	}
	return c, nil
}

// checkSandboxListOptions checks ListSandboxes' options.
func checkSandboxListOptions(o ListSandboxesOptions) error {
	if o.RunID != "" {
		if err := checkRunID("run_id", o.RunID); err != nil {
			return err
		}
	}
	if err := checkLabels("labels", o.Labels); err != nil {
		return err
	}
	switch o.Status {
	case "", SandboxRunning, SandboxStopped, SandboxPaused:
	default:
		return badField("status", "unknown sandbox status %q", clip(string(o.Status)))
	}
	if o.PageSize < 0 || o.PageSize > maxPageSize {
		return badField("page_size", "must be between 0 and %d", maxPageSize)
	}
	if tok := o.PageToken; tok != "" {
		micros, id, ok := strings.Cut(tok, ".")
		if len(tok) > maxPageTokenBytes || !ok || checkSandboxID("page_token", id) != nil || strings.Trim(micros, "0123456789") != "" || micros == "" {
			return badField("page_token", "not a page token of this service")
		}
	}
	return nil
}
