package agentd

import (
	"time"

	"github.com/bulkhead-dev/bulkhead/pkg/agentd/activity"
)

// Activity is the daemon's activity clock, which the transport touches
// for every call that counts (see LastActivity).
func (d *Daemon) Activity() *activity.Clock { return d.activity }

// LastActivity samples the CPU time of the processes the daemon runs (a
// rise since the previous sample is activity now, see cpuSampler) and
// returns the daemon's last activity, never earlier than its start, with
// the number of processes still running. The clock also moves when a
// process starts, ends or writes output, when a port forward carries
// bytes, and when the transport touches it for a call.
func (d *Daemon) LastActivity() (last time.Time, running int) {
	var pids [64]int
	if d.cpu.sample(d.procs.RunningPIDs(pids[:0])) {
		d.activity.Touch()
	}
	return d.activity.Last(), d.procs.Running()
}
