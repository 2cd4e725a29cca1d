package skills

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
)

// LoadSkillToolName is the name of the lazy loading tool.
const LoadSkillToolName = "load_skill"

// loadSkillDescription is the model-facing description.
const loadSkillDescription = "Copies one of the available skills into the sandbox workspace (its SKILL.md with " +
	"any scripts, references and assets) and returns its instructions."

// loadSkillSchema is the parameter schema of load_skill.
const loadSkillSchema = `{"type":"object","properties":{"skill_name":{"type":"string",` +
	`"description":"The name of one skill from the list of available skills."}},` +
	`"required":["skill_name"],"additionalProperties":false}`

// Statuses of a load_skill result.
const (
	StatusLoaded        = "loaded"
	StatusAlreadyLoaded = "already_loaded"
)

// LoadResult is the JSON object load_skill returns to the model.
type LoadResult struct {
	// Status is StatusLoaded or StatusAlreadyLoaded.
	Status string `json:"status"`
	// SkillName is the skill's name.
	SkillName string `json:"skill_name"`
	// Path is the skill's directory: workspace-relative, or absolute
	// when the run has a working directory and the workspace root is
	// known.
	Path string `json:"path"`
	// Files lists the skill's files relative to Path.
	Files []string `json:"files"`
	// Instructions is SKILL.md without its frontmatter.
	Instructions string `json:"instructions"`
}

// loadSkillTool is the load_skill tool of one run.
type loadSkillTool struct {
	s *Skills
}

// Definition returns the function tool.
func (t *loadSkillTool) Definition() model.Tool {
	return model.FunctionTool(LoadSkillToolName, loadSkillDescription, json.RawMessage(loadSkillSchema), true)
}

// Call stages the named skill under <Path>/<name>/ through the daemon, as
// the run's user, unless its SKILL.md is already there, and returns its
// instructions. SKILL.md is written last, so its presence means the whole
// bundle was written; an interrupted load is completed by the next one.
func (t *loadSkillTool) Call(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	if call.Agent == nil {
		return tool.Result{}, errors.New("load_skill: the run has no sandbox")
	}
	var args struct {
		SkillName string `json:"skill_name"`
	}
	if err := json.Unmarshal([]byte(input), &args); err != nil {
		return failure(`load_skill: the arguments must be a JSON object {"skill_name": "<name>"}: ` + err.Error()), nil
	}
	name := strings.TrimSpace(args.SkillName)
	s := t.s
	b := s.byName[name]
	if b == nil {
		names := make([]string, len(s.bundles))
		for i, x := range s.bundles {
			names[i] = x.name
		}
		return failure(fmt.Sprintf("load_skill: there is no skill named %q; the available skills are: %s",
			name, strings.Join(names, ", "))), nil
	}
	dir := s.dir(b)

	s.mu.Lock()
	defer s.mu.Unlock()
	status := StatusAlreadyLoaded
	if !s.loaded[name] {
		present, err := staged(ctx, call, path.Join(dir, SkillFile))
		if err != nil {
			return t.stageFailure(call, name, err)
		}
		if !present {
			for _, f := range stageOrder(b.files) {
				if err := write(ctx, call, path.Join(dir, f.path), f); err != nil {
					return t.stageFailure(call, name, err)
				}
			}
			status = StatusLoaded
		}
		s.loaded[name] = true
	}
	call.Log.Debug("load_skill", zap.String("call_id", call.CallID), zap.String("skill", name),
		zap.String("status", status), zap.Int("files", len(b.files)))

	res := LoadResult{Status: status, SkillName: name, Path: dir, Instructions: b.body}
	if call.Workdir != "" && call.Session != nil && call.Session.Manifest() != nil {
		res.Path = path.Join(call.Session.Manifest().WorkspaceRoot(), dir)
	}
	for _, f := range b.files {
		res.Files = append(res.Files, f.path)
	}
	out, err := json.Marshal(res)
	if err != nil {
		return tool.Result{}, fmt.Errorf("load_skill %s: %w", name, err)
	}
	return tool.Result{Output: string(out)}, nil
}

// staged reports whether the file at p exists in the workspace.
func staged(ctx context.Context, call tool.Context, p string) (bool, error) {
	_, err := call.Agent.Stat(ctx, p, agentclient.StatOptions{User: call.RunAs})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errkind.ErrNotFound) && !errors.Is(err, errkind.ErrUserNotFound):
		return false, nil
	}
	return false, err
}

// stageOrder returns the files with SKILL.md last.
func stageOrder(files []file) []file {
	out := make([]file, 0, len(files))
	var skill *file
	for i := range files {
		if files[i].path == SkillFile {
			skill = &files[i]
			continue
		}
		out = append(out, files[i])
	}
	if skill != nil {
		out = append(out, *skill)
	}
	return out
}

// write writes one file atomically as the run's user, creating parents.
func write(ctx context.Context, call tool.Context, p string, f file) error {
	size := int64(len(f.data))
	_, err := call.Agent.WriteFile(ctx, p, agentclient.WriteFileOptions{
		Mode:          uint32(fileMode(f)),
		User:          call.RunAs,
		CreateParents: true,
		Overwrite:     agentclient.OverwriteAlways,
		ExpectedSize:  &size,
	}, bytes.NewReader(f.data))
	if err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}

// stageFailure renders a failed Stat or WriteFile: problems of the
// workspace the model can see and work around become an error result;
// anything else (the sandbox is gone, the run's user is unknown) ends the
// call with an error.
func (t *loadSkillTool) stageFailure(call tool.Context, name string, err error) (tool.Result, error) {
	if errors.Is(err, errkind.ErrUserNotFound) {
		return tool.Result{}, fmt.Errorf("load_skill %s: %w", name, err)
	}
	for _, s := range []error{errkind.ErrPermissionDenied, errkind.ErrReadOnly, errkind.ErrNotDirectory,
		errkind.ErrIsDirectory, errkind.ErrNoSpace, errkind.ErrResourceExhausted, errkind.ErrPathEscape,
		errkind.ErrAlreadyExists, errkind.ErrInvalidArgument} {
		if errors.Is(err, s) {
			call.Log.Debug("load_skill failed", zap.String("call_id", call.CallID), zap.String("skill", name),
				zap.String("class", s.Error()))
			return failure(fmt.Sprintf("load_skill: could not stage skill %q in %s: %s",
				name, t.s.dir(t.s.byName[name]), s.Error())), nil
		}
	}
	return tool.Result{}, fmt.Errorf("load_skill %s: %w", name, err)
}

// failure is an error result for the model.
func failure(msg string) tool.Result { return tool.Result{Output: msg, IsError: true} }
