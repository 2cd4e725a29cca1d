package server

import (
	"github.com/bulkhead-dev/bulkhead/pkg/agentd"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/materialize"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/metrics"
	"github.com/bulkhead-dev/bulkhead/pkg/agentd/workspace"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

func (s *workspaceService) Materialize(stream agentdv1.WorkspaceService_MaterializeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	p := first.GetPlan()
	if p == nil {
		return errmap.ToStatus(errkind.Errorf(errkind.ErrInvalidArgument, "Materialize: the first message must be the plan"))
	}
	req, err := materializeRequest(p)
	if err != nil {
		return errmap.ToStatus(err)
	}
	next := func() ([]byte, bool, error) {
		m, err := stream.Recv()
		s.m.WorkspaceBytes(metrics.Materialize, len(m.GetData()))
		return m.GetData(), m.GetPlan() != nil, err
	}
	res, err := s.d.Materialize(stream.Context(), req, &chunkReader{next: next})
	if err != nil {
		return errmap.ToStatus(err)
	}
	out := &agentdv1.MaterializeResponse{
		Files:         make([]*agentdv1.MaterializedFile, len(res.Files)),
		Directories:   res.Dirs,
		Symlinks:      res.Symlinks,
		UsersCreated:  res.UsersCreated,
		GroupsCreated: res.GroupsCreated,
	}
	for i, f := range res.Files {
		out.Files[i] = &agentdv1.MaterializedFile{Path: f.Path, Size: f.Size, Sha256: f.SHA256, Mode: wireMode(f.Mode)}
	}
	return stream.SendAndClose(out)
}

// materializeRequest converts the wire plan.
func materializeRequest(p *agentdv1.MaterializePlan) (agentd.MaterializeRequest, error) {
	var req agentd.MaterializeRequest
	for _, g := range p.GetGroups() {
		mg := materialize.Group{Name: g.GetName()}
		if g.GetHasGid() {
			gid := g.GetGid()
			mg.GID = &gid
		}
		req.Plan.Groups = append(req.Plan.Groups, mg)
	}
	for _, u := range p.GetUsers() {
		mu := materialize.User{Name: u.GetName(), Groups: u.GetGroups(), Home: u.GetHome(), Shell: u.GetShell()}
		if u.GetHasUid() {
			uid := u.GetUid()
			mu.UID = &uid
		}
		req.Plan.Users = append(req.Plan.Users, mu)
	}
	req.Plan.Entries = make([]materialize.Entry, len(p.GetEntries()))
	for i, e := range p.GetEntries() {
		mode, err := fileMode(e.GetMode())
		if err != nil {
			return req, &errkind.PathError{Op: "materialize", Path: e.GetPath(), Err: err}
		}
		me := materialize.Entry{Path: e.GetPath(), Mode: mode, User: e.GetUser(), Group: e.GetGroup(), Size: e.GetSize(), LinkTarget: e.GetLinkTarget(), Volatile: e.GetVolatile()}
		switch e.GetKind() {
		case agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_FILE:
			me.Kind = materialize.KindFile
		case agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_DIRECTORY:
			me.Kind = materialize.KindDir
		case agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_SYMLINK:
			me.Kind = materialize.KindSymlink
		default:
			return req, errkind.Errorf(errkind.ErrInvalidArgument, "entry %q: kind is not set", e.GetPath())
		}
		req.Plan.Entries[i] = me
	}
	req.Plan.RootUser = p.GetRootUser()
	if p.GetSetGrants() {
		req.SetGrants = true
		for _, g := range p.GetGrants() {
			req.Grants = append(req.Grants, workspace.Grant{Path: g.GetPath(), ReadOnly: g.GetReadOnly()})
		}
	}
	if p.GetSetEnvironment() {
		req.SetEnvironment = true
		req.Environment = p.GetEnvironment()
	}
	return req, nil
}
