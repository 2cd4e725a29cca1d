package harness

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
)

// ApprovalPolicy decides whether a tool call needs a human's approval
// before it runs. Policies are set per tool name in Agent.Approvals.
type ApprovalPolicy func(ctx context.Context, call ToolCall) (bool, error)

// AlwaysApprove is a policy requiring approval for every call.
func AlwaysApprove() ApprovalPolicy {
	return func(context.Context, ToolCall) (bool, error) { return true, nil }
}

// CommandsOutside requires approval for exec_command calls whose command
// does not match any of the allowed patterns (matched against the whole
// command): run `go test ./...` freely, ask before anything else. A command
// with shell control characters (; & | ` $ < > or a newline) always needs
// approval, so an allowed prefix cannot smuggle another command in.
func CommandsOutside(allowed ...*regexp.Regexp) ApprovalPolicy {
	return func(_ context.Context, call ToolCall) (bool, error) {
		var args struct {
			Cmd string `json:"cmd"`
		}
		if err := json.Unmarshal([]byte(call.Input), &args); err != nil || args.Cmd == "" {
			return true, nil // unreadable: a human decides
		}
		if strings.ContainsAny(args.Cmd, ";&|`$<>\n") {
			return true, nil
		}
		for _, re := range allowed {
			if loc := re.FindStringIndex(args.Cmd); loc != nil && loc[0] == 0 && loc[1] == len(args.Cmd) {
				return false, nil
			}
		}
		return true, nil
	}
}

// DefaultRejection is what the model sees of a rejected call without a
// message.
const DefaultRejection = "The user did not approve this tool call; it was not run."
