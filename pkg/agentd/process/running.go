package process

// RunningPIDs appends to dst the pid of every process whose exit has not
// been reported yet (each is its group's leader, and its session's with a
// TTY) and returns it. There are at most Config.MaxProcesses of them.
func (m *Manager) RunningPIDs(dst []int) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.procs {
		select {
		case <-p.exited:
		default:
			dst = append(dst, p.pid)
		}
	}
	return dst
}
