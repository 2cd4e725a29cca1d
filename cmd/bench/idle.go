package main

import (
	"context"
	"fmt"
	"os"
)

// benchIdle is the idle figures of the daemon at pid (started from agentd,
// a client connected) beside grpcfloor (fl; nil: not running): binary size,
// idle RSS, idle working set, then the package init cost of one more start
// of each, traced (after the working set's wait, so that no other start
// touches the binary's pages during it).
func benchIdle(ctx context.Context, binDir, agentd string, pid int, fl *floor) ([]row, error) {
	idle, err := readRSS(pid)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(agentd)
	if err != nil {
		return nil, err
	}
	const rssFigure = "sandbox-agentd idle RSS: total (private anonymous + shared clean pages of the binary)"
	rows := []row{{"sandbox-agentd binary size (static, stripped)", mib(fi.Size()), "", "", "small"}}
	floorPID := 0
	if fl != nil {
		floorPID = fl.pid()
		base, err := readRSS(floorPID)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row{rssFigure, idle.String(),
			base.String() + " (grpcfloor: grpc-go with health and reflection only)", fmt.Sprintf("%.2fx", float64(idle.total)/float64(base.total)), "< 10 MB"})
	} else {
		rows = append(rows, row{rssFigure, idle.String(), "", "", "< 10 MB"})
	}
	fmt.Fprintf(os.Stderr, "idle working set (2 x %s) ...\n", workingSetWait)
	rows = append(rows, workingSetRows(pid, floorPID)...)
	fmt.Fprintln(os.Stderr, "package init cost ...")
	r, err := benchInitCost(ctx, binDir, agentd, fl != nil)
	if err != nil {
		return nil, err
	}
	return append(rows, r...), nil
}
