package compute

import (
	"context"
	"fmt"
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// LastActivity asks the sandbox's daemon when its sandbox was last in use
// and how many of the processes it started are still running. Use, as
// the daemon sees it, is any call to it but this one (health checks never
// count), a process starting, ending or writing output, a port forward
// carrying bytes, or its processes using CPU time, which the daemon
// samples at each of these calls: CPU use between two calls is dated at
// the second. The answer is never before the daemon started, and calling
// LastActivity does not move it, so a caller may poll it to decide
// whether the sandbox is idle. A daemon too old to report it answers
// ErrUnimplemented; other failures are the daemon client's errors.
func (s *Session) LastActivity(ctx context.Context) (time.Time, int, error) {
	info, err := s.Agent().Info(ctx)
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("session %s: last activity: %w", s.id, err)
	}
	if info.LastActivity.IsZero() {
		return time.Time{}, 0, fmt.Errorf("session %s: last activity: %w", s.id,
			errkind.Errorf(errkind.ErrUnimplemented, "sandbox-agentd %s does not report its last activity", info.Version))
	}
	return info.LastActivity, info.RunningProcesses, nil
}
