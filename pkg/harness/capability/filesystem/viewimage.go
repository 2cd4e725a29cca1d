package filesystem

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

// ViewImageToolName is the name of the image tool.
const ViewImageToolName = "view_image"

// viewImageDescription is the model-facing description.
const viewImageDescription = "Shows you an image file from the sandbox workspace (PNG, JPEG, GIF or WebP), " +
	"returned as an image you can look at."

// viewImageSchema is the parameter schema of view_image.
const viewImageSchema = `{"type":"object","properties":{"path":{"type":"string","minLength":1,` +
	`"description":"The image file: relative to the working directory, or absolute inside the workspace."}},` +
	`"required":["path"],"additionalProperties":false}`

// sniffBytes is how many leading bytes identify every supported type.
const sniffBytes = 12

// imageType returns the media type the leading bytes of data identify, or
// "" when they are not a PNG, JPEG, GIF or WebP image. The types are the
// ones the Responses API accepts as image input; the file name never
// matters.
func imageType(data []byte) string {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case bytes.HasPrefix(data, []byte("\xff\xd8\xff")):
		return "image/jpeg"
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		return "image/gif"
	case len(data) >= 12 && bytes.Equal(data[:4], []byte("RIFF")) && bytes.Equal(data[8:12], []byte("WEBP")):
		return "image/webp"
	}
	return ""
}

// viewImageTool is the view_image tool.
type viewImageTool struct {
	maxBytes int64
}

// Definition returns the function tool.
func (t *viewImageTool) Definition() model.Tool {
	return model.FunctionTool(ViewImageToolName, viewImageDescription, json.RawMessage(viewImageSchema), false)
}

// viewImageArgs are the call's arguments.
type viewImageArgs struct {
	Path string `json:"path"`
}

// Call reads the image through the daemon as the run's user and returns it
// as an image input. A file over the cap is refused from its size before
// any byte is read; a read never transfers more than the cap plus one byte,
// and stops as soon as the leading bytes show the file is not an image.
func (t *viewImageTool) Call(ctx context.Context, call tool.Context, input string) (tool.Result, error) {
	if call.Agent == nil {
		return tool.Result{}, errors.New("view_image: the run has no sandbox")
	}
	var args viewImageArgs
	if err := json.Unmarshal([]byte(input), &args); err != nil {
		return failure(`view_image: the arguments must be a JSON object {"path": "<image file>"}: ` + err.Error()), nil
	}
	shown := strings.TrimSpace(args.Path)
	if shown == "" {
		return failure("view_image: path must not be empty"), nil
	}
	target := shown
	if !path.IsAbs(target) {
		target = path.Join(call.Workdir, target)
	}

	info, err := call.Agent.Stat(ctx, target, agentclient.StatOptions{User: call.RunAs})
	if err != nil {
		return t.readFailure(call, shown, err)
	}
	switch info.Type {
	case agentclient.FileDirectory:
		return failure(fmt.Sprintf("image path `%s` is a directory, not an image file", shown)), nil
	case agentclient.FileOther:
		return failure(fmt.Sprintf("image path `%s` is not a supported image file: it is not a regular file", shown)), nil
	case agentclient.FileRegular:
		if info.Size > t.maxBytes {
			return t.tooLarge(shown), nil
		}
	}
	// A symlink is described by Stat, not followed: its target's size is
	// only known while reading, where the cap still holds.

	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream when the sink stops it early
	sink := &imageSink{max: t.maxBytes}
	if info.Type == agentclient.FileRegular {
		sink.buf = make([]byte, 0, info.Size)
	}
	_, err = call.Agent.ReadFile(ctx, target, agentclient.ReadFileOptions{Limit: t.maxBytes + 1, User: call.RunAs}, sink)
	switch {
	case errors.Is(err, errTooLarge):
		return t.tooLarge(shown), nil
	case errors.Is(err, errNotImage):
		return notImage(shown), nil
	case err != nil:
		return t.readFailure(call, shown, err)
	case int64(len(sink.buf)) > t.maxBytes:
		return t.tooLarge(shown), nil
	}
	mime := imageType(sink.buf)
	if mime == "" {
		return notImage(shown), nil
	}
	call.Log.Debug("view_image", zap.String("call_id", call.CallID), zap.String("path", shown),
		zap.String("type", mime), zap.Int("bytes", len(sink.buf)))
	return tool.Result{
		Output: fmt.Sprintf("Image `%s` (%s, %d bytes).", shown, mime, len(sink.buf)),
		Images: []model.Content{model.ImageDataContent(mime, sink.buf, "auto")},
	}, nil
}

func (t *viewImageTool) tooLarge(shown string) tool.Result {
	return failure(fmt.Sprintf("image path `%s` exceeded the allowed size of %s; resize or compress the image and try again",
		shown, sizeText(t.maxBytes)))
}

func notImage(shown string) tool.Result {
	return failure(fmt.Sprintf("image path `%s` is not a supported image file (PNG, JPEG, GIF or WebP, recognized by content)", shown))
}

// readFailure renders a failed Stat or ReadFile for the model, naming only
// the path it gave; failures it cannot act on end the call with an error.
func (t *viewImageTool) readFailure(call tool.Context, shown string, err error) (tool.Result, error) {
	var msg string
	switch {
	case errors.Is(err, errkind.ErrUserNotFound):
		return tool.Result{}, fmt.Errorf("view_image %s: %w", shown, err)
	case errors.Is(err, errkind.ErrNotFound):
		msg = fmt.Sprintf("image path `%s` was not found", shown)
	case errors.Is(err, errkind.ErrPathEscape):
		msg = fmt.Sprintf("image path `%s` is outside the workspace", shown)
		if call.Workdir != "" && !path.IsAbs(shown) {
			msg += fmt.Sprintf(" (relative paths are resolved from the working directory '%s')", call.Workdir)
		}
	case errors.Is(err, errkind.ErrPermissionDenied), errors.Is(err, errkind.ErrIsDirectory),
		errors.Is(err, errkind.ErrNotDirectory), errors.Is(err, errkind.ErrResourceExhausted),
		errors.Is(err, errkind.ErrInvalidArgument):
		msg = fmt.Sprintf("unable to read image at `%s`: %s", shown, sentinelText(err))
	default:
		return tool.Result{}, fmt.Errorf("view_image %s: %w", shown, err)
	}
	call.Log.Debug("view_image failed", zap.String("call_id", call.CallID), zap.String("path", shown),
		zap.String("class", errorClass(err)))
	return failure(msg), nil
}

// Errors the sink uses to stop a read early.
var (
	errTooLarge = errors.New("image exceeds the size cap")
	errNotImage = errors.New("not an image")
)

// imageSink collects a file's bytes up to max and stops the read as soon as
// the content cannot be an image or grows past max.
type imageSink struct {
	buf     []byte
	max     int64
	checked bool
}

func (s *imageSink) Write(p []byte) (int, error) {
	if int64(len(s.buf))+int64(len(p)) > s.max {
		return 0, errTooLarge
	}
	s.buf = append(s.buf, p...)
	if !s.checked && len(s.buf) >= sniffBytes {
		s.checked = true
		if imageType(s.buf) == "" {
			return 0, errNotImage
		}
	}
	return len(p), nil
}
