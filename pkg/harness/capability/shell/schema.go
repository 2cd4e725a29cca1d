package shell

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
)

// Tool names.
const (
	ExecCommandName = "exec_command"
	WriteStdinName  = "write_stdin"
)

const execDescription = "Runs a shell command in the sandbox and returns its output, or, when it is " +
	"still running after the yield time, a session ID for further interaction with write_stdin."

const writeDescription = "Writes characters to a running exec_command session and returns the output " +
	"it produced since the last call."

// execSchema is exec_command's parameter schema; %d is the default yield.
const execSchema = `{"type":"object","properties":{` +
	`"cmd":{"type":"string","minLength":1,"description":"The shell command to run."},` +
	`"workdir":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"description":"Directory to run the command in: relative to the current working directory, or absolute inside the workspace. Defaults to the current working directory."},` +
	`"shell":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"description":"Shell program that runs the command. Defaults to the sandbox's default shell."},` +
	`"login":{"type":"boolean","default":true,"description":"Run the shell as a login shell (-l). Defaults to true."},` +
	`"tty":{"type":"boolean","default":false,"description":"Run the command in a pseudo-terminal, so that write_stdin can send it input and Ctrl-C. Defaults to false (plain pipes, no input)."},` +
	`"yield_time_ms":{"type":"integer","minimum":0,"default":%d,"description":"How long to wait, in milliseconds, for the command to finish before returning the output so far."},` +
	`"max_output_tokens":{"anyOf":[{"type":"integer","minimum":1},{"type":"null"}],"default":null,"description":"Most tokens of output to return; the middle of longer output is cut out."}` +
	`},"required":["cmd"]}`

// writeSchema is write_stdin's parameter schema; %d is the default yield.
const writeSchema = `{"type":"object","properties":{` +
	`"session_id":{"type":"integer","description":"The session ID exec_command returned for the running command."},` +
	`"chars":{"type":"string","default":"","description":"Characters to write to the command's terminal; empty to only poll for new output."},` +
	`"yield_time_ms":{"type":"integer","minimum":0,"default":%d,"description":"How long to wait, in milliseconds, for output before returning."},` +
	`"max_output_tokens":{"anyOf":[{"type":"integer","minimum":1},{"type":"null"}],"default":null,"description":"Most tokens of output to return; the middle of longer output is cut out."}` +
	`},"required":["session_id"]}`

// execDefinition returns exec_command's definition. The schema is not
// strict, as in the reference: optional parameters have defaults and may
// be left out.
func (s *Shell) execDefinition() model.Tool {
	return model.FunctionTool(ExecCommandName, execDescription,
		json.RawMessage(fmt.Sprintf(execSchema, s.opts.ExecYield.Milliseconds())), false)
}

// writeDefinition returns write_stdin's definition.
func (s *Shell) writeDefinition() model.Tool {
	return model.FunctionTool(WriteStdinName, writeDescription,
		json.RawMessage(fmt.Sprintf(writeSchema, s.opts.WriteYield.Milliseconds())), false)
}

// execArgs are exec_command's arguments.
type execArgs struct {
	Cmd             string  `json:"cmd"`
	Workdir         *string `json:"workdir"`
	Shell           *string `json:"shell"`
	Login           *bool   `json:"login"`
	TTY             *bool   `json:"tty"`
	YieldTimeMS     *number `json:"yield_time_ms"`
	MaxOutputTokens *number `json:"max_output_tokens"`
}

// writeArgs are write_stdin's arguments.
type writeArgs struct {
	SessionID       *number `json:"session_id"`
	Chars           *string `json:"chars"`
	YieldTimeMS     *number `json:"yield_time_ms"`
	MaxOutputTokens *number `json:"max_output_tokens"`
}

// number is an integer argument. Like the reference's validation it also
// accepts an integral float (5000.0) and a numeric string ("5000").
type number int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *number) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		b = []byte(strings.TrimSpace(s))
	}
	if v, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		*n = number(v)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return fmt.Errorf("%s is not an integer", b)
	}
	*n = number(f)
	return nil
}

// decodeArgs parses a call's JSON arguments into v.
func decodeArgs(input string, v any) error {
	if strings.TrimSpace(input) == "" {
		input = "{}"
	}
	if err := json.Unmarshal([]byte(input), v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("%s must be of type %s", te.Field, jsonType(te.Type.Kind().String()))
		}
		return fmt.Errorf("invalid arguments: %w", err)
	}
	return nil
}

// jsonType names a Go kind as JSON schema does.
func jsonType(kind string) string {
	switch kind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "int64", "int":
		return "integer"
	}
	return kind
}

// yieldArg returns a yield time argument, or def when absent.
func yieldArg(name string, v *number, def time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	if *v < 0 {
		return 0, fmt.Errorf("%s must be at least 0", name)
	}
	ms := min(int64(*v), 1<<40) // far beyond the clamp, and no overflow below
	return time.Duration(ms) * time.Millisecond, nil
}

// maxTokensArg returns max_output_tokens, 0 when absent.
func maxTokensArg(v *number) (int, error) {
	if v == nil {
		return 0, nil
	}
	if *v < 1 {
		return 0, errors.New("max_output_tokens must be at least 1")
	}
	return int(min(int64(*v), math.MaxInt32)), nil
}

// clampYield applies the reference's clamp to a yield time.
func clampYield(d time.Duration) time.Duration { return min(max(d, MinYield), MaxYield) }

// execWait is how long exec_command waits for the command to exit.
func execWait(yield time.Duration) time.Duration { return clampYield(yield) }

// writeWait is how long write_stdin waits for output: a poll (no input)
// waits at least pollMin (MinPollYield); after input, the process is also given
// settleAfterWrite to react, as in the reference.
func writeWait(yield time.Duration, input bool, pollMin time.Duration) time.Duration {
	if !input {
		return max(clampYield(yield), pollMin)
	}
	return clampYield(yield) + settleAfterWrite
}
