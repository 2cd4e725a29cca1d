package agentclient

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

// TestGoTypesCoverTheWire: every field of a message the API carries has a
// field of the same name in its Go type (snake_case to CamelCase, "Id" as
// "ID", "Sha256" as "SHA256", a has_x flag as the pointer x), so a field
// added to the contract cannot be left out of the Go API unnoticed. The
// parts a method takes as parameters (a path, a process id) are listed
// with the pair.
func TestGoTypesCoverTheWire(t *testing.T) {
	for _, c := range []struct {
		msg    proto.Message
		goType any
		params []string // fields that are a method's parameters
	}{
		{&agentdv1.ProcessSpec{}, ProcessSpec{}, nil},
		{&agentdv1.TerminalSize{}, TerminalSize{}, nil},
		{&agentdv1.OutputChunk{}, OutputChunk{}, nil},
		{&agentdv1.ExitStatus{}, ExitStatus{}, nil},
		{&agentdv1.ProcessInfo{}, ProcessInfo{}, nil},
		{&agentdv1.StartRequest{}, StartOptions{}, []string{"spec"}},
		{&agentdv1.StartResponse{}, StartResult{}, nil},
		{&agentdv1.ExecRequest{}, ExecOptions{}, []string{"spec"}},
		{&agentdv1.ExecResponse{}, ExecEvent{}, nil},
		{&agentdv1.ReadOutputRequest{}, ReadOutputOptions{}, []string{"process_id"}},
		{&agentdv1.ReadOutputResponse{}, Output{}, nil},
		{&agentdv1.AttachRequest{}, FollowOptions{}, []string{"process_id"}},
		{&agentdv1.AttachResponse{}, Output{}, nil},
		{&agentdv1.FileInfo{}, FileInfo{}, nil},
		{&agentdv1.ReadFileRequest{}, ReadFileOptions{}, []string{"path"}},
		{&agentdv1.WriteFileHeader{}, WriteFileOptions{}, []string{"path"}},
		{&agentdv1.WriteFileResponse{}, WriteFileResult{}, nil},
		{&agentdv1.StatRequest{}, StatOptions{}, []string{"path"}},
		{&agentdv1.ListDirRequest{}, ListDirOptions{}, []string{"path"}},
		{&agentdv1.ListDirResponse{}, DirPage{}, nil},
		{&agentdv1.MakeDirRequest{}, MakeDirOptions{}, []string{"path"}},
		{&agentdv1.RemoveRequest{}, RemoveOptions{}, []string{"path"}},
		{&agentdv1.RenameRequest{}, RenameOptions{}, []string{"from", "to"}},
		{&agentdv1.PatchOperation{}, PatchOperation{}, nil},
		{&agentdv1.ApplyPatchRequest{}, ApplyPatchOptions{}, []string{"patch", "operations"}},
		{&agentdv1.PatchChange{}, PatchChange{}, nil},
		{&agentdv1.ApplyPatchResponse{}, PatchResult{}, nil},
		{&agentdv1.PatchRejection{}, PatchRejectionDetail{}, nil},
		{&agentdv1.ArchiveRequest{}, ArchiveOptions{}, nil},
		{&agentdv1.ArchiveStats{}, ArchiveStats{}, nil},
		{&agentdv1.ArchiveLimits{}, ArchiveLimits{}, nil},
		{&agentdv1.RestoreHeader{}, RestoreOptions{}, nil},
		{&agentdv1.RestoreResponse{}, RestoreResult{}, nil},
		{&agentdv1.FingerprintRequest{}, FingerprintOptions{}, nil},
		{&agentdv1.MaterializeEntry{}, MaterializeEntry{}, nil},
		{&agentdv1.MaterializeUser{}, MaterializeUser{}, nil},
		{&agentdv1.MaterializeGroup{}, MaterializeGroup{}, nil},
		{&agentdv1.MaterializeGrant{}, MaterializeGrant{}, nil},
		{&agentdv1.MaterializePlan{}, MaterializePlan{}, nil},
		{&agentdv1.MaterializedFile{}, MaterializedFile{}, nil},
		{&agentdv1.MaterializeResponse{}, MaterializeResult{}, nil},
		{&agentdv1.InfoResponse{}, DaemonInfo{}, nil},
		{&agentdv1.Limits{}, DaemonLimits{}, nil},
		{&agentdv1.PathGrant{}, PathGrant{}, nil},
		{&agentdv1.PrepareCheckpointRequest{}, PrepareCheckpointOptions{}, nil},
	} {
		gt := reflect.TypeOf(c.goType)
		fields := c.msg.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			name := string(fields.Get(i).Name())
			if strings.Contains(strings.Join(c.params, " "), name) {
				continue
			}
			if rest, ok := strings.CutPrefix(name, "has_"); ok {
				name = rest // a pointer in Go
			}
			if _, ok := gt.FieldByName(goName(name)); !ok {
				t.Errorf("%s.%s has no field %s in %s", c.msg.ProtoReflect().Descriptor().Name(), name, goName(name), gt)
			}
		}
	}
}

// goName is the Go field name of a proto field name.
func goName(snake string) string {
	var b strings.Builder
	for _, part := range strings.Split(snake, "_") {
		switch part {
		case "id", "uid", "gid", "pid":
			b.WriteString(strings.ToUpper(part))
		case "sha256":
			b.WriteString("SHA256")
		default:
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// TestConversionsFromTheWire: a message with every field set converts to
// a Go value with every field set, and the values arrive.
func TestConversionsFromTheWire(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for name, got := range map[string]any{
		"ProcessInfo":       processOf(full(&agentdv1.ProcessInfo{}).(*agentdv1.ProcessInfo)),
		"ExitStatus":        *exitOf(full(&agentdv1.ExitStatus{}).(*agentdv1.ExitStatus)),
		"FileInfo":          fileInfoOf(full(&agentdv1.FileInfo{}).(*agentdv1.FileInfo)),
		"PatchResult":       *patchResultOf(full(&agentdv1.ApplyPatchResponse{}).(*agentdv1.ApplyPatchResponse)),
		"ArchiveStats":      statsOf(full(&agentdv1.ArchiveStats{}).(*agentdv1.ArchiveStats)),
		"MaterializeResult": *materializeResultOf(full(&agentdv1.MaterializeResponse{}).(*agentdv1.MaterializeResponse)),
		"DaemonInfo":        *daemonInfoOf(full(&agentdv1.InfoResponse{}).(*agentdv1.InfoResponse)),
		"ExecEvent":         *execEventOf(full(&agentdv1.ExecResponse{}).(*agentdv1.ExecResponse)),
		"PatchRejectionDetail": *rejectionOf(&agentdv1.PatchRejection{Path: "p", ExpectedLines: []string{"a"}, ClosestLine: 3,
			ClosestLines: []string{"b"}, Kind: agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED,
			Cause: agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND, Message: "m"}),
	} {
		checkAllSet(t, name, reflect.ValueOf(got))
	}
	var out Output
	outputOf(&out, full(&agentdv1.AttachResponse{}).(*agentdv1.AttachResponse))
	checkAllSet(t, "Output", reflect.ValueOf(out))

	e := exitOf(&agentdv1.ExitStatus{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, ExitedAt: timestamp(at)})
	if *e != (ExitStatus{ExitCode: 137, Signal: "SIGKILL", TimedOut: true, ExitedAt: at}) {
		t.Errorf("exit status: %+v", e)
	}
	if fi := fileInfoOf(&agentdv1.FileInfo{Type: agentdv1.FileType_FILE_TYPE_DIRECTORY}); !fi.IsDir() || fi.IsRegular() || !fi.ModifiedAt.IsZero() {
		t.Errorf("a directory without a time: %+v", fi)
	}
	if fi := fileInfoOf(&agentdv1.FileInfo{Type: agentdv1.FileType(99)}); fi.Type != "" {
		t.Errorf("an unknown file type became %q, want \"\"", fi.Type)
	}
	rej := rejectionOf(&agentdv1.PatchRejection{Kind: agentdv1.ErrorReason_ERROR_REASON_PATCH_REJECTED, Cause: agentdv1.ErrorReason_ERROR_REASON_NOT_FOUND})
	if !errors.Is(rej.Kind, errkind.ErrPatchRejected) || !errors.Is(rej.Cause, errkind.ErrNotFound) {
		t.Errorf("rejection kind %v, cause %v", rej.Kind, rej.Cause)
	}
	if rej := rejectionOf(&agentdv1.PatchRejection{}); rej.Kind != nil || rej.Cause != nil {
		t.Errorf("an unspecified kind and cause: %v, %v", rej.Kind, rej.Cause)
	}
	if exitOf(nil) != nil || rejectionOf(nil) != nil || fileInfoPtr(nil) != nil {
		t.Error("an absent message must stay absent")
	}
}

// TestConversionsToTheWire: a Go value with every field set converts to a
// message with every field set, and the values arrive.
func TestConversionsToTheWire(t *testing.T) {
	size := int64(5)
	uid, gid := uint32(1001), uint32(1002)
	spec := specToProto(ProcessSpec{Argv: []string{"a"}, Command: "c", Shell: "/bin/bash", Login: true, Cwd: "w",
		Env: map[string]string{"K": "V"}, User: "u", Tty: true, Size: TerminalSize{Rows: 2, Cols: 3}, Stdin: true,
		Timeout: 1500 * time.Millisecond})
	hdr := writeHeaderToProto("p", WriteFileOptions{Mode: 0o600, User: "u", CreateParents: true, Overwrite: OverwriteNever,
		ExpectedSize: &size, ExpectedSHA256: []byte{1}, ComputeSHA256: true})
	plan := planToProto(&MaterializePlan{
		Groups: []MaterializeGroup{{Name: "g", GID: &gid}}, Users: []MaterializeUser{{Name: "u", UID: &uid, Groups: []string{"g"}, Home: "/h", Shell: "/s"}},
		Entries: []*MaterializeEntry{{Path: "f", Kind: EntrySymlink, Mode: 0o644, User: "u", Group: "g", Size: 1, LinkTarget: "t", Volatile: true}},
		Grants:  []MaterializeGrant{{Path: "/d", ReadOnly: true}}, SetGrants: true, RootUser: "u",
		Environment: map[string]string{"K": "V"}, SetEnvironment: true,
	})
	restore := restoreHeaderToProto(RestoreOptions{Exclude: []string{"x"}, PreserveOwnership: true, AllowExternalSymlinks: true,
		Limits: ArchiveLimits{MaxMembers: 1, MaxExtractedBytes: 2, MaxInputBytes: 3}})
	ops := operationsToProto([]PatchOperation{{Type: PatchUpdateFile, Path: "p", Diff: "d", MoveTo: "m"}})
	ckpt := prepareCheckpointToProto(PrepareCheckpointOptions{ResumeAfter: 90 * time.Second})
	for _, m := range []proto.Message{spec, hdr, plan, plan.GetGroups()[0], plan.GetUsers()[0], plan.GetEntries()[0], plan.GetGrants()[0],
		restore, restore.GetLimits(), ops.GetOperations()[0], ckpt} {
		checkAllHas(t, m)
	}
	if spec.GetTimeout().AsDuration() != 1500*time.Millisecond || spec.GetSize().GetCols() != 3 {
		t.Errorf("spec: %v", spec)
	}
	if hdr.GetOverwrite() != agentdv1.OverwritePolicy_OVERWRITE_POLICY_NEVER || hdr.GetExpectedSize() != 5 {
		t.Errorf("header: %v", hdr)
	}
	if e := plan.GetEntries()[0]; e.GetKind() != agentdv1.MaterializeEntryKind_MATERIALIZE_ENTRY_KIND_SYMLINK || plan.GetUsers()[0].GetUid() != uid {
		t.Errorf("plan: %v", plan)
	}
	if ops.GetOperations()[0].GetType() != agentdv1.PatchOperationType_PATCH_OPERATION_TYPE_UPDATE_FILE {
		t.Errorf("operations: %v", ops)
	}
	if ckpt.GetResumeAfter().AsDuration() != 90*time.Second {
		t.Errorf("prepare checkpoint: %v", ckpt)
	}
	// Zero values are left out: the daemon's defaults apply.
	if r := prepareCheckpointToProto(PrepareCheckpointOptions{}); r.GetResumeAfter() != nil {
		t.Errorf("a zero lease must stay unset: %v", r)
	}
	if s := specToProto(ProcessSpec{Command: "c"}); s.GetSize() != nil || s.GetTimeout() != nil {
		t.Errorf("a zero size and timeout must stay unset: %v", s)
	}
	if r := restoreHeaderToProto(RestoreOptions{}); r.GetLimits() != nil {
		t.Errorf("zero limits must stay unset: %v", r)
	}
	if u := planToProto(&MaterializePlan{Users: []MaterializeUser{{Name: "u"}}}).GetUsers()[0]; u.GetHasUid() {
		t.Errorf("a user without a uid: %v", u)
	}
}

// full sets every field of m (recursively, one element per list and map,
// enum value 1, oneofs on their first case) and returns it.
func full(m proto.Message) proto.Message {
	fill(m.ProtoReflect(), 3)
	return m
}

func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && od.Fields().Get(0) != fd {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind {
				if depth > 0 {
					e := l.NewElement()
					fill(e.Message(), depth-1)
					l.Append(e)
				}
				continue
			}
			l.Append(scalar(fd))
		case fd.IsMap():
			m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), scalar(fd.MapValue()))
		case fd.Kind() == protoreflect.MessageKind:
			if depth > 0 {
				fill(m.Mutable(fd).Message(), depth-1)
			}
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("s")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("b"))
	}
	panic("no value for " + fd.Kind().String())
}

// checkAllSet fails for every exported field of v (a struct) that is
// zero.
func checkAllSet(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		if f := v.Type().Field(i); f.IsExported() && v.Field(i).IsZero() {
			t.Errorf("%s.%s was not converted", name, f.Name)
		}
	}
}

// checkAllHas fails for every field of m that is not set.
func checkAllHas(t *testing.T, m proto.Message) {
	t.Helper()
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); !r.Has(fd) {
			t.Errorf("%s.%s was not converted", r.Descriptor().Name(), fd.Name())
		}
	}
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
