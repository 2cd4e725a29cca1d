package agentclient

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/internal/wire/errmap"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// The conversions between the Go types of types.go and the wire's
// messages: the one place the two meet. A message the daemon left out
// becomes a zero value (or nil, where the Go type has a pointer); an enum
// value this client does not know becomes "".

func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

func durationOf(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// Processes.

func specToProto(s ProcessSpec) *agentdv1.ProcessSpec {
	return &agentdv1.ProcessSpec{
		Argv: s.Argv, Command: s.Command, Shell: s.Shell, Login: s.Login, Cwd: s.Cwd, Env: s.Env,
		User: s.User, Tty: s.Tty, Size: sizeToProto(s.Size), Stdin: s.Stdin, Timeout: durationOf(s.Timeout),
	}
}

func sizeToProto(s TerminalSize) *agentdv1.TerminalSize {
	if s == (TerminalSize{}) {
		return nil
	}
	return &agentdv1.TerminalSize{Rows: s.Rows, Cols: s.Cols}
}

func streamOf(s agentdv1.OutputStream) OutputStream {
	switch s {
	case agentdv1.OutputStream_OUTPUT_STREAM_STDOUT:
		return StreamStdout
	case agentdv1.OutputStream_OUTPUT_STREAM_STDERR:
		return StreamStderr
	case agentdv1.OutputStream_OUTPUT_STREAM_PTY:
		return StreamPTY
	}
	return ""
}

// chunksOf appends src's chunks to dst[:0], reusing dst's array. The
// chunks' data is src's (not copied).
func chunksOf(dst []OutputChunk, src []*agentdv1.OutputChunk) []OutputChunk {
	dst = dst[:0]
	for _, ch := range src {
		dst = append(dst, OutputChunk{Stream: streamOf(ch.GetStream()), Offset: ch.GetOffset(), Data: ch.GetData()})
	}
	return dst
}

func exitOf(e *agentdv1.ExitStatus) *ExitStatus {
	if e == nil {
		return nil
	}
	return &ExitStatus{ExitCode: int(e.GetExitCode()), Signal: e.GetSignal(), TimedOut: e.GetTimedOut(), ExitedAt: timeOf(e.GetExitedAt())}
}

func stateOf(s agentdv1.ProcessState) ProcessState {
	switch s {
	case agentdv1.ProcessState_PROCESS_STATE_RUNNING:
		return ProcessRunning
	case agentdv1.ProcessState_PROCESS_STATE_EXITED:
		return ProcessExited
	}
	return ""
}

func processOf(p *agentdv1.ProcessInfo) ProcessInfo {
	if p == nil {
		return ProcessInfo{}
	}
	return ProcessInfo{
		ProcessID: p.GetProcessId(), PID: int(p.GetPid()), Argv: p.GetArgv(), Cwd: p.GetCwd(), User: p.GetUser(),
		Tty: p.GetTty(), StartedAt: timeOf(p.GetStartedAt()), State: stateOf(p.GetState()), Exit: exitOf(p.GetExit()),
		RequestID: p.GetRequestId(),
	}
}

// outputMessage is what ReadOutputResponse and AttachResponse share.
type outputMessage interface {
	GetChunks() []*agentdv1.OutputChunk
	GetNextCursor() int64
	GetDroppedBytes() int64
	GetExit() *agentdv1.ExitStatus
}

// outputOf fills o from m, reusing o's chunk array.
func outputOf(o *Output, m outputMessage) {
	*o = Output{Chunks: chunksOf(o.Chunks, m.GetChunks()), NextCursor: m.GetNextCursor(),
		DroppedBytes: m.GetDroppedBytes(), Exit: exitOf(m.GetExit())}
}

func execEventOf(m *agentdv1.ExecResponse) *ExecEvent {
	ev := &ExecEvent{Chunks: chunksOf(nil, m.GetChunks()), DroppedBytes: m.GetDroppedBytes(), Exit: exitOf(m.GetExit())}
	if m.GetStarted() != nil {
		p := processOf(m.GetStarted())
		ev.Started = &p
	}
	return ev
}

// Files.

func fileTypeOf(t agentdv1.FileType) FileType {
	switch t {
	case agentdv1.FileType_FILE_TYPE_REGULAR:
		return FileRegular
	case agentdv1.FileType_FILE_TYPE_DIRECTORY:
		return FileDirectory
	case agentdv1.FileType_FILE_TYPE_SYMLINK:
		return FileSymlink
	case agentdv1.FileType_FILE_TYPE_OTHER:
		return FileOther
	}
	return ""
}

func fileInfoOf(fi *agentdv1.FileInfo) FileInfo {
	if fi == nil {
		return FileInfo{}
	}
	return FileInfo{
		Path: fi.GetPath(), Name: fi.GetName(), Type: fileTypeOf(fi.GetType()), Size: fi.GetSize(), Mode: fi.GetMode(),
		UID: fi.GetUid(), GID: fi.GetGid(), Owner: fi.GetOwner(), Group: fi.GetGroup(),
		ModifiedAt: timeOf(fi.GetModifiedAt()), SymlinkTarget: fi.GetSymlinkTarget(), RawName: fi.GetRawName(),
	}
}

// fileInfoPtr is fileInfoOf as a pointer, nil for nil.
func fileInfoPtr(fi *agentdv1.FileInfo) *FileInfo {
	if fi == nil {
		return nil
	}
	info := fileInfoOf(fi)
	return &info
}

func overwriteToProto(p OverwritePolicy) agentdv1.OverwritePolicy {
	switch p {
	case OverwriteAlways:
		return agentdv1.OverwritePolicy_OVERWRITE_POLICY_ALWAYS
	case OverwriteNever:
		return agentdv1.OverwritePolicy_OVERWRITE_POLICY_NEVER
	case OverwriteOnlyIfExists:
		return agentdv1.OverwritePolicy_OVERWRITE_POLICY_ONLY_IF_EXISTS
	}
	return agentdv1.OverwritePolicy_OVERWRITE_POLICY_UNSPECIFIED
}

func writeHeaderToProto(path string, o WriteFileOptions) *agentdv1.WriteFileHeader {
	return &agentdv1.WriteFileHeader{
		Path: path, Mode: o.Mode, User: o.User, CreateParents: o.CreateParents, Overwrite: overwriteToProto(o.Overwrite),
		ExpectedSize: o.ExpectedSize, ExpectedSha256: o.ExpectedSHA256, ComputeSha256: o.ComputeSHA256,
	}
}

// Patches.

func operationsToProto(ops []PatchOperation) *agentdv1.PatchOperations {
	out := &agentdv1.PatchOperations{Operations: make([]*agentdv1.PatchOperation, 0, len(ops))}
	for _, o := range ops {
		typ := agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_UNSPECIFIED
		switch o.Type {
		case PatchCreateFile:
			typ = agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_CREATE_FILE
		case PatchUpdateFile:
			typ = agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_UPDATE_FILE
		case PatchDeleteFile:
			typ = agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_DELETE_FILE
		}
		out.Operations = append(out.Operations, &agentdv1.PatchOperation{Type: typ, Path: o.Path, Diff: o.Diff, MoveTo: o.MoveTo})
	}
	return out
}

func changeKindOf(k agentdv1.PatchChangeKind) PatchChangeKind {
	switch k {
	case agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_CREATED:
		return PatchCreated
	case agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_UPDATED:
		return PatchUpdated
	case agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_MOVED:
		return PatchMoved
	case agentdv1.PatchChangeKind_PATCH_CHANGE_KIND_DELETED:
		return PatchDeleted
	}
	return ""
}

func patchResultOf(r *agentdv1.ApplyPatchResponse) *PatchResult {
	out := &PatchResult{Changes: make([]PatchChange, 0, len(r.GetChanges()))}
	for _, c := range r.GetChanges() {
		out.Changes = append(out.Changes, PatchChange{Kind: changeKindOf(c.GetKind()), Path: c.GetPath(), NewPath: c.GetNewPath()})
	}
	return out
}

func rejectionOf(r *agentdv1.PatchRejection) *PatchRejectionDetail {
	if r == nil {
		return nil
	}
	return &PatchRejectionDetail{
		Path: r.GetPath(), ExpectedLines: r.GetExpectedLines(), ClosestLine: int(r.GetClosestLine()),
		ClosestLines: r.GetClosestLines(), Kind: errmap.ReasonSentinel(r.GetKind()),
		Cause: errmap.ReasonSentinel(r.GetCause()), Message: r.GetMessage(),
	}
}

// Workspace.

func compressionToProto(c ArchiveCompression) agentdv1.ArchiveCompression {
	switch c {
	case CompressionZstd:
		return agentdv1.ArchiveCompression_ARCHIVE_COMPRESSION_ZSTD
	case CompressionNone:
		return agentdv1.ArchiveCompression_ARCHIVE_COMPRESSION_NONE
	}
	return agentdv1.ArchiveCompression_ARCHIVE_COMPRESSION_UNSPECIFIED
}

func statsOf(s *agentdv1.ArchiveStats) ArchiveStats {
	return ArchiveStats{Members: s.GetMembers(), Files: s.GetFiles(), Dirs: s.GetDirs(), Symlinks: s.GetSymlinks(),
		HardLinks: s.GetHardLinks(), Bytes: s.GetBytes(), Skipped: s.GetSkipped()}
}

func restoreHeaderToProto(o RestoreOptions) *agentdv1.RestoreHeader {
	h := &agentdv1.RestoreHeader{Exclude: o.Exclude, PreserveOwnership: o.PreserveOwnership, AllowExternalSymlinks: o.AllowExternalSymlinks}
	if o.Limits != (ArchiveLimits{}) {
		h.Limits = &agentdv1.ArchiveLimits{MaxMembers: o.Limits.MaxMembers, MaxExtractedBytes: o.Limits.MaxExtractedBytes,
			MaxInputBytes: o.Limits.MaxInputBytes}
	}
	return h
}

func entryKindToProto(k MaterializeEntryKind) agentdv1.MaterializeEntryKind {
	switch k {
	case EntryFile:
		return agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_FILE
	case EntryDirectory:
		return agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_DIRECTORY
	case EntrySymlink:
		return agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_SYMLINK
	}
	return agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_UNSPECIFIED
}

func planToProto(p *MaterializePlan) *agentdv1.MaterializePlan {
	if p == nil {
		return &agentdv1.MaterializePlan{}
	}
	out := &agentdv1.MaterializePlan{SetGrants: p.SetGrants, RootUser: p.RootUser, Environment: p.Environment,
		SetEnvironment: p.SetEnvironment}
	for _, g := range p.Groups {
		wg := &agentdv1.MaterializeGroup{Name: g.Name}
		if g.GID != nil {
			wg.Gid, wg.HasGid = *g.GID, true
		}
		out.Groups = append(out.Groups, wg)
	}
	for _, u := range p.Users {
		wu := &agentdv1.MaterializeUser{Name: u.Name, Groups: u.Groups, Home: u.Home, Shell: u.Shell}
		if u.UID != nil {
			wu.Uid, wu.HasUid = *u.UID, true
		}
		out.Users = append(out.Users, wu)
	}
	out.Entries = make([]*agentdv1.MaterializeEntry, 0, len(p.Entries))
	for _, e := range p.Entries {
		if e == nil {
			continue
		}
		out.Entries = append(out.Entries, &agentdv1.MaterializeEntry{Path: e.Path, Kind: entryKindToProto(e.Kind),
			Mode: e.Mode, User: e.User, Group: e.Group, Size: e.Size, LinkTarget: e.LinkTarget, Volatile: e.Volatile})
	}
	for _, g := range p.Grants {
		out.Grants = append(out.Grants, &agentdv1.MaterializeGrant{Path: g.Path, ReadOnly: g.ReadOnly})
	}
	return out
}

func materializeResultOf(r *agentdv1.MaterializeResponse) *MaterializeResult {
	out := &MaterializeResult{Directories: r.GetDirectories(), Symlinks: r.GetSymlinks(),
		UsersCreated: r.GetUsersCreated(), GroupsCreated: r.GetGroupsCreated()}
	if files := r.GetFiles(); len(files) > 0 {
		out.Files = make([]MaterializedFile, 0, len(files))
		for _, f := range files {
			out.Files = append(out.Files, MaterializedFile{Path: f.GetPath(), Size: f.GetSize(), SHA256: f.GetSha256(), Mode: f.GetMode()})
		}
	}
	return out
}

// The daemon.

func prepareCheckpointToProto(o PrepareCheckpointOptions) *agentdv1.PrepareCheckpointRequest {
	r := &agentdv1.PrepareCheckpointRequest{}
	if o.ResumeAfter != 0 {
		r.ResumeAfter = durationpb.New(o.ResumeAfter)
	}
	return r
}

func daemonInfoOf(r *agentdv1.InfoResponse) *DaemonInfo {
	l := r.GetLimits()
	out := &DaemonInfo{
		Version: r.GetVersion(), Commit: r.GetCommit(), WorkspaceRoot: r.GetWorkspaceRoot(), Features: r.GetFeatures(),
		RunningAsRoot: r.GetRunningAsRoot(), UID: r.GetUid(), GID: r.GetGid(), DefaultUser: r.GetDefaultUser(),
		Limits: DaemonLimits{MaxProcesses: int(l.GetMaxProcesses()), OutputBufferBytes: l.GetOutputBufferBytes(),
			MaxReadBytes: int(l.GetMaxReadBytes()), MaxFileBytes: l.GetMaxFileBytes(), MaxPatchBytes: l.GetMaxPatchBytes()},
		StartedAt: timeOf(r.GetStartedAt()), PID: int(r.GetPid()), Platform: r.GetPlatform(),
		LastActivity: timeOf(r.GetLastActivity()), RunningProcesses: int(r.GetRunningProcesses()),
	}
	for _, g := range r.GetGrants() {
		out.Grants = append(out.Grants, PathGrant{Path: g.GetPath(), ReadOnly: g.GetReadOnly()})
	}
	return out
}
