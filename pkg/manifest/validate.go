package manifest

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Validate checks m against every rule of the format and returns a
// *ValidationError listing all problems (each with the path of the offending
// field), or nil. It does not apply Limits or trust rules; LoadUntrusted does.
//
// The rules: a known version; an absolute clean root other than "/"; entry
// paths relative, clean, inside the workspace (see ValidateEntryPath), joined
// with their parents' paths for dir children, unique, never below a file or
// inside a mount; per-type fields present, well formed and only on the types
// they belong to; permissions in range, a directory mode only on directory
// entries, none on mounts; entry groups declared; user and group names
// portable, unique, with unique non-zero ids, user groups declared; run_as a
// declared user or root; environment names portable, each a value or a secret
// reference; extra path grants absolute, clean, not "/", unique and apart from
// the workspace root. The root account and group exist in every sandbox: they
// cannot be declared, but run_as and entry groups may name them.
func (m *Manifest) Validate() error {
	var p problems
	m.validate(&p)
	return p.err()
}

// accounts is what entry validation needs to know about declared accounts.
type accounts struct {
	users  map[string]bool
	groups map[string]bool
}

func (m *Manifest) validate(p *problems) {
	if m.Version != 0 && m.Version != CurrentVersion {
		p.invalid("version", fmt.Sprintf("unsupported version %d (this build reads version %d)", m.Version, CurrentVersion))
	}
	root := m.WorkspaceRoot()
	if m.Root != "" {
		if err := checkAbsPath(m.Root); err != nil {
			p.invalid("root", err.Error())
		} else if m.Root == "/" {
			p.invalid("root", `the workspace root must not be "/"`)
		}
	}
	acct := m.validateAccounts(p)
	m.validateEnvironment(p)
	m.validateGrants(p, root)
	entries := m.validateEntries(p, acct)
	m.validateRedaction(p, entries)
}

func (m *Manifest) validateAccounts(p *problems) accounts {
	acct := accounts{users: map[string]bool{}, groups: map[string]bool{}}
	gids := map[uint32]string{}
	for i, g := range m.Groups {
		fp := indexPath("groups", i)
		if err := checkAccountName(g.Name); err != nil {
			p.invalid(fieldPath(fp, "name"), err.Error())
		} else if g.Name == "root" {
			p.invalid(fieldPath(fp, "name"), `group "root" exists in every sandbox and cannot be declared`)
		} else if acct.groups[g.Name] {
			p.invalid(fieldPath(fp, "name"), fmt.Sprintf("group %q is declared twice", g.Name))
		}
		acct.groups[g.Name] = true
		if g.GID != nil {
			checkID(p, fieldPath(fp, "gid"), *g.GID, gids, "gid")
		}
	}
	uids := map[uint32]string{}
	for i, u := range m.Users {
		fp := indexPath("users", i)
		if err := checkAccountName(u.Name); err != nil {
			p.invalid(fieldPath(fp, "name"), err.Error())
		} else if u.Name == "root" {
			p.invalid(fieldPath(fp, "name"), `user "root" exists in every sandbox and cannot be declared; use run_as: root`)
		} else if acct.users[u.Name] {
			p.invalid(fieldPath(fp, "name"), fmt.Sprintf("user %q is declared twice", u.Name))
		} else if acct.groups[u.Name] {
			p.invalid(fieldPath(fp, "name"), fmt.Sprintf("%q is also declared as a group; every user already gets a private group of its own name", u.Name))
		}
		acct.users[u.Name] = true
		if u.UID != nil {
			checkID(p, fieldPath(fp, "uid"), *u.UID, uids, "uid")
		}
		seen := map[string]bool{}
		for j, g := range u.Groups {
			gp := indexPath(fieldPath(fp, "groups"), j)
			switch {
			case !acct.groups[g]:
				p.invalid(gp, fmt.Sprintf("group %q is not declared in groups", g))
			case seen[g]:
				p.invalid(gp, fmt.Sprintf("group %q is listed twice", g))
			}
			seen[g] = true
		}
		if u.Home != "" {
			if err := checkAbsPath(u.Home); err != nil {
				p.invalid(fieldPath(fp, "home"), err.Error())
			}
		}
		if u.Shell != "" {
			if err := checkAbsPath(u.Shell); err != nil {
				p.invalid(fieldPath(fp, "shell"), err.Error())
			}
		}
	}
	if m.RunAs != "" && m.RunAs != "root" {
		if err := checkAccountName(m.RunAs); err != nil {
			p.invalid("run_as", err.Error())
		} else if !acct.users[m.RunAs] {
			p.invalid("run_as", fmt.Sprintf("user %q is not declared in users", m.RunAs))
		}
	}
	return acct
}

// checkID rejects id 0 (a second root account is never intended), the
// reserved id 2^32-1, and ids used twice.
func checkID(p *problems, fp string, id uint32, seen map[uint32]string, what string) {
	switch {
	case id == 0:
		p.invalid(fp, what+" 0 is root's; declare another id")
	case id == math.MaxUint32:
		p.invalid(fp, fmt.Sprintf("%s %d is reserved", what, id))
	case seen[id] != "":
		p.invalid(fp, fmt.Sprintf("%s %d is already used by %s", what, id, seen[id]))
	default:
		seen[id] = fp
	}
}

func (m *Manifest) validateEnvironment(p *problems) {
	for _, name := range sortedKeys(m.Environment) {
		v := m.Environment[name]
		fp := keyPath("environment", name)
		if err := checkEnvName(name); err != nil {
			p.invalid(fp, err.Error())
		}
		if v.Secret != nil {
			if v.Value != "" {
				p.invalid(fp, "set either value or secret, not both")
			}
			if err := checkSecretName(v.Secret.Name); err != nil {
				p.invalid(fieldPath(fp, "secret"), err.Error())
			}
		} else {
			switch {
			case strings.IndexByte(v.Value, 0) >= 0:
				p.invalid(fieldPath(fp, "value"), "value contains a NUL byte")
			case len(v.Value) > maxEnvValueBytes:
				p.invalid(fieldPath(fp, "value"), fmt.Sprintf("value is longer than %d bytes", maxEnvValueBytes))
			}
		}
		if err := checkText(v.Description); err != nil {
			p.invalid(fieldPath(fp, "description"), err.Error())
		}
	}
}

func (m *Manifest) validateGrants(p *problems, root string) {
	seen := map[string]string{}
	for i, g := range m.ExtraPathGrants {
		fp := indexPath("extra_path_grants", i)
		pp := fieldPath(fp, "path")
		if err := checkAbsPath(g.Path); err != nil {
			p.invalid(pp, err.Error())
		} else {
			switch {
			case g.Path == "/":
				p.invalid(pp, `a grant must not be the filesystem root "/"`)
			case seen[g.Path] != "":
				p.invalid(pp, fmt.Sprintf("%q is already granted by %s", g.Path, seen[g.Path]))
			case isUnder(g.Path, root) || isUnder(root, g.Path):
				p.invalid(pp, fmt.Sprintf("%q overlaps the workspace root %q; grants are for paths outside it", g.Path, root))
			default:
				seen[g.Path] = fp
			}
		}
		if err := checkText(g.Description); err != nil {
			p.invalid(fieldPath(fp, "description"), err.Error())
		}
	}
}

// validateEntries checks every entry and returns them by full path.
func (m *Manifest) validateEntries(p *problems, acct accounts) map[string]*Entry {
	items := m.flatten(p)
	byPath := map[string]string{} // path -> field of its first declaration
	leaves := map[string]string{} // non-directory entries
	mounts := map[string]string{} // mount entries
	redacted := map[string]bool{} // sources listed in Redaction
	found := map[string]*Entry{}
	if m.Redaction != nil {
		for _, s := range m.Redaction.Sources {
			redacted[s] = true
		}
	}
	for _, it := range items {
		if first, dup := byPath[it.path]; dup {
			p.invalid(it.field, fmt.Sprintf("path %q is already declared at %s", it.path, first))
			continue
		}
		byPath[it.path] = it.field
		found[it.path] = it.e
		for i := range len(it.path) {
			if it.path[i] != '/' {
				continue
			}
			anc := it.path[:i]
			if f, ok := leaves[anc]; ok {
				p.invalid(it.field, fmt.Sprintf("path %q is below %s, which is not a directory", it.path, f))
			}
			if f, ok := mounts[anc]; ok {
				p.invalid(it.field, fmt.Sprintf("path %q is inside the mount %s; nothing can be placed inside a mount", it.path, f))
			}
		}
		if it.e.Type.Known() && !it.e.Type.IsDir() {
			leaves[it.path] = it.field
		}
		if it.e.Type.IsMount() {
			mounts[it.path] = it.field
		}
		validateEntry(p, it, acct, redacted[it.path])
	}
	return found
}

func validateEntry(p *problems, it item, acct accounts, srcRedacted bool) {
	e, fp := it.e, it.field
	if !e.Type.Known() {
		if e.Type == "" {
			p.invalid(fieldPath(fp, "type"), "required")
		} else {
			p.invalid(fieldPath(fp, "type"), fmt.Sprintf("unknown entry type %q (known: %s)", e.Type, typeList()))
		}
		return
	}
	if err := checkText(e.Description); err != nil {
		p.invalid(fieldPath(fp, "description"), err.Error())
	}
	if e.Group != "" {
		if err := checkAccountName(e.Group); err != nil {
			p.invalid(fieldPath(fp, "group"), err.Error())
		} else if !acct.groups[e.Group] && !acct.users[e.Group] && e.Group != "root" {
			p.invalid(fieldPath(fp, "group"), fmt.Sprintf("group %q is not declared in groups or users", e.Group))
		}
	}
	if e.Permissions != nil {
		pp := fieldPath(fp, "permissions")
		switch {
		case e.Type.IsMount():
			p.invalid(pp, "mount entries take no permissions; the storage decides access")
		case e.Permissions.check() != "":
			p.invalid(pp, e.Permissions.check())
		case e.Permissions.Directory && !e.Type.IsDir():
			p.invalid(pp, fmt.Sprintf("a directory mode on a %s entry", e.Type))
		}
	}

	// Fields that belong to other types.
	if e.Content != nil && e.Type != TypeFile {
		p.invalid(fieldPath(fp, "content"), "only file entries have content")
	}
	if len(e.Children) > 0 && e.Type != TypeDir {
		p.invalid(fieldPath(fp, "children"), "only dir entries have children")
	}
	if e.Src != "" && !e.Type.IsHostSource() {
		p.invalid(fieldPath(fp, "src"), "only local_file and local_dir entries have src")
	}
	if e.Git != nil && e.Type != TypeGitRepo {
		p.invalid(fp, "git repository fields on a "+string(e.Type)+" entry")
	}
	if e.Mount != nil && !e.Type.IsMount() {
		p.invalid(fp, "mount fields on a "+string(e.Type)+" entry")
	}

	switch {
	case e.Type.IsHostSource():
		if e.Src == "" {
			if !srcRedacted {
				p.invalid(fieldPath(fp, "src"), "required")
			}
		} else if err := checkHostSrc(e.Src, e.Type == TypeLocalDir); err != nil {
			p.invalid(fieldPath(fp, "src"), err.Error())
		}
	case e.Type == TypeGitRepo:
		validateGit(p, fp, e.Git)
	case e.Type.IsMount():
		validateMount(p, fp, e.Type, e.Mount)
	}
}

func validateGit(p *problems, fp string, g *GitRepo) {
	if g == nil {
		p.invalid(fieldPath(fp, "repo"), "required")
		p.invalid(fieldPath(fp, "ref"), "required")
		return
	}
	if g.Host != "" {
		if err := checkGitHost(g.Host); err != nil {
			p.invalid(fieldPath(fp, "host"), err.Error())
		}
	}
	if err := checkGitRepoPath(g.Repo); err != nil {
		p.invalid(fieldPath(fp, "repo"), err.Error())
	}
	if err := checkGitRef(g.Ref); err != nil {
		p.invalid(fieldPath(fp, "ref"), err.Error())
	}
	if err := checkSubPath(g.Subpath); err != nil {
		p.invalid(fieldPath(fp, "subpath"), err.Error())
	}
	if g.Token != nil {
		if err := checkSecretName(g.Token.Name); err != nil {
			p.invalid(fieldPath(fieldPath(fp, "token"), "secret"), err.Error())
		}
	}
}

// mountFieldUse says, per mount type, whether a field is required (2),
// optional (1) or not used (0).
func mountFieldUse(t EntryType, field string) int {
	if t == TypeS3FilesMount {
		switch field {
		case "file_system_id", "region":
			return 2
		case "subpath", "mount_target_ip", "access_point", "extra_options", "read_only":
			return 1
		}
		return 0
	}
	switch field {
	case "bucket":
		if t == TypeAzureBlobMount {
			return 0
		}
		return 2
	case "account":
		switch t {
		case TypeR2Mount, TypeAzureBlobMount:
			return 2
		}
		return 0
	case "container":
		if t == TypeAzureBlobMount {
			return 2
		}
		return 0
	case "region":
		if t == TypeS3Mount || t == TypeGCSMount {
			return 1
		}
		return 0
	case "prefix", "endpoint", "read_only", "credentials":
		return 1
	}
	return 0
}

func validateMount(p *problems, fp string, t EntryType, mt *Mount) {
	if mt == nil {
		mt = &Mount{}
	}
	tokens := []struct {
		name  string
		value string
		max   int
	}{
		{"bucket", mt.Bucket, 255},
		{"account", mt.Account, 64},
		{"container", mt.Container, 255},
		{"region", mt.Region, 64},
	}
	for _, f := range tokens {
		use := mountFieldUse(t, f.name)
		switch {
		case f.value == "" && use == 2:
			p.invalid(fieldPath(fp, f.name), "required")
		case f.value != "" && use == 0:
			p.invalid(fieldPath(fp, f.name), fmt.Sprintf("not used by %s entries", t))
		case f.value != "":
			if err := checkToken(f.value, f.max); err != nil {
				p.invalid(fieldPath(fp, f.name), err.Error())
			}
		}
	}
	// The other fields: each is checked when set, and reported as not used
	// when set on a type that does not take it.
	others := []struct {
		name  string
		set   bool
		check func() error
	}{
		{"prefix", mt.Prefix != "", func() error { return checkSubPath(mt.Prefix) }},
		{"endpoint", mt.Endpoint != "", func() error { return checkEndpoint(mt.Endpoint) }},
		{"file_system_id", mt.FileSystemID != "", func() error { return checkAWSID(mt.FileSystemID, "fs-") }},
		{"subpath", mt.Subpath != "", func() error { return checkFileSystemPath(mt.Subpath) }},
		{"mount_target_ip", mt.MountTargetIP != "", func() error { return checkMountTargetIP(mt.MountTargetIP) }},
		{"access_point", mt.AccessPoint != "", func() error { return checkAWSID(mt.AccessPoint, "fsap-") }},
		{"extra_options", mt.ExtraOptions != nil, nil},
		{"read_only", mt.ReadOnly != nil, nil},
		{"credentials", len(mt.Credentials) > 0, nil},
	}
	for _, f := range others {
		use := mountFieldUse(t, f.name)
		switch {
		case !f.set && use == 2:
			p.invalid(fieldPath(fp, f.name), "required")
		case f.set && use == 0:
			p.invalid(fieldPath(fp, f.name), fmt.Sprintf("not used by %s entries", t))
		case f.set && f.check != nil:
			if err := f.check(); err != nil {
				p.invalid(fieldPath(fp, f.name), err.Error())
			}
		}
	}
	if mountFieldUse(t, "extra_options") > 0 {
		validateMountOptions(p, fieldPath(fp, "extra_options"), mt.ExtraOptions)
	}
	if mountFieldUse(t, "credentials") == 0 {
		return
	}
	allowed := CredentialKeys(t)
	for _, k := range sortedKeys(mt.Credentials) {
		cp := keyPath(fieldPath(fp, "credentials"), k)
		if !slices.Contains(allowed, k) {
			p.invalid(cp, fmt.Sprintf("unknown credential for %s (known: %s)", t, strings.Join(allowed, ", ")))
			continue
		}
		if err := checkSecretName(mt.Credentials[k].Name); err != nil {
			p.invalid(fieldPath(cp, "secret"), err.Error())
		}
	}
}

// maxMountOptions bounds extra_options.
const maxMountOptions = 32

// validateMountOptions checks the extra NFS options of an S3 Files mount:
// each "name" or "name=value" of a small character set (no ',' that would
// smuggle in another option, no spaces), each name once.
func validateMountOptions(p *problems, fp string, opts []string) {
	if len(opts) > maxMountOptions {
		p.invalid(fp, fmt.Sprintf("%d options; at most %d", len(opts), maxMountOptions))
		return
	}
	seen := map[string]bool{}
	for i, o := range opts {
		if err := checkMountOption(o); err != nil {
			p.invalid(indexPath(fp, i), err.Error())
			continue
		}
		name, _, _ := strings.Cut(o, "=")
		if seen[name] {
			p.invalid(indexPath(fp, i), fmt.Sprintf("option %q is given twice", name))
		}
		seen[name] = true
	}
}

func (m *Manifest) validateRedaction(p *problems, entries map[string]*Entry) {
	if m.Redaction == nil {
		return
	}
	seen := map[string]bool{}
	for i, s := range m.Redaction.Sources {
		fp := indexPath("redacted.sources", i)
		if err := ValidateEntryPath(s); err != nil {
			p.invalid(fp, err.Error())
			continue
		}
		if seen[s] {
			p.invalid(fp, fmt.Sprintf("%q is listed twice", s))
		}
		seen[s] = true
		if e := entries[s]; e == nil || !e.Type.IsHostSource() || e.Src != "" {
			p.invalid(fp, fmt.Sprintf("%q is not a local_file or local_dir entry without src", s))
		}
	}
	for i, g := range m.Redaction.Grants {
		if err := checkAbsPath(g); err != nil {
			p.invalid(indexPath("redacted.grants", i), err.Error())
		}
	}
}

func typeList() string {
	var names []string
	for _, t := range EntryTypes() {
		names = append(names, string(t))
	}
	return strings.Join(names, ", ")
}
