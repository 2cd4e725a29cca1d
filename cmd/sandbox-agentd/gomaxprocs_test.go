package main

import (
	"runtime"
	"testing"
)

// TestGOMAXPROCSFlag checks how the daemon chooses GOMAXPROCS: one by
// default, the environment variable when the flag is not given, the flag
// over the environment, 0 for the runtime's own choice, and a negative
// value refused.
func TestGOMAXPROCSFlag(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	base := []string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth", "--workspace", t.TempDir()}
	cases := []struct {
		name string
		args []string
		env  string
		want int // GOMAXPROCS after apply; 0: left as it was
	}{
		{"default", nil, "", DefaultGOMAXPROCS},
		{"environment", nil, "3", 0},
		{"flag over environment", []string{"--gomaxprocs", "2"}, "3", 2},
		{"flag", []string{"--gomaxprocs", "4"}, "", 4},
		{"runtime default", []string{"--gomaxprocs", "0"}, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", c.env)
			runtime.GOMAXPROCS(7) // a value none of the cases sets
			_, lo, err := parseFlags(append(base, c.args...))
			if err != nil {
				t.Fatal(err)
			}
			set := lo.procs.apply()
			got := runtime.GOMAXPROCS(0)
			if c.want == 0 {
				if set != 0 || got != 7 {
					t.Fatalf("apply() = %d, GOMAXPROCS %d; want it left at 7", set, got)
				}
				return
			}
			if set != c.want || got != c.want {
				t.Fatalf("apply() = %d, GOMAXPROCS %d; want %d", set, got, c.want)
			}
		})
	}
	if _, _, err := parseFlags(append(base, "--gomaxprocs", "-1")); err == nil {
		t.Fatal("--gomaxprocs -1: parsed")
	}
}

// TestArchiveGOMAXPROCSFlag checks the count Archive and Restore raise
// GOMAXPROCS to: Go's default (the count before apply) unless
// --archive-gomaxprocs names one; a negative value refused.
func TestArchiveGOMAXPROCSFlag(t *testing.T) {
	base := []string{"--listen", "unix:///tmp/x.sock", "--insecure-no-auth", "--workspace", t.TempDir()}
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 6},
		{[]string{"--archive-gomaxprocs", "0"}, 6},
		{[]string{"--archive-gomaxprocs", "3"}, 3},
	} {
		_, lo, err := parseFlags(append(base, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		if got := lo.procs.bulkOr(6); got != c.want {
			t.Errorf("%v: bulkOr(6) = %d, want %d", c.args, got, c.want)
		}
	}
	if _, _, err := parseFlags(append(base, "--archive-gomaxprocs", "-1")); err == nil {
		t.Fatal("--archive-gomaxprocs -1: parsed")
	}
}
