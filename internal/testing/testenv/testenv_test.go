package testenv

import (
	"testing"
)

// recorder is a testing.TB that records how a test ended.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped = true
	r.msg = args[0].(string)
}
func (r *recorder) Fatalf(format string, args ...any) { r.failed = true; r.msg = format }

func TestRequire(t *testing.T) {
	missing := Condition(false, "the part is missing")
	present := Condition(true, "never shown")
	cases := []struct {
		name       string
		ci         string
		needs      []Need
		skip, fail bool
	}{
		{"met", "", []Need{present}, false, false},
		{"met under CI", "true", []Need{present}, false, false},
		{"missing on a developer machine", "", []Need{present, missing}, true, false},
		{"missing under CI", "true", []Need{missing}, false, true},
		{"CI=false is a developer machine", "false", []Need{missing}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			r := &recorder{TB: t}
			Require(r, c.needs...)
			if r.skipped != c.skip || r.failed != c.fail {
				t.Fatalf("skipped=%v failed=%v (%q), want skipped=%v failed=%v", r.skipped, r.failed, r.msg, c.skip, c.fail)
			}
		})
	}
}

func TestDockerMayBeMissingUnderCI(t *testing.T) {
	t.Setenv("CI", "true")
	r := &recorder{TB: t}
	docker.once.Do(func() {}) // keep the real probe out of it
	saved := docker.why
	docker.why = "Docker does not answer"
	defer func() { docker.why = saved }()
	Require(r, Docker)
	if !r.skipped || r.failed {
		t.Fatalf("Docker missing under CI: skipped=%v failed=%v, want a skip", r.skipped, r.failed)
	}
	r = &recorder{TB: t}
	Require(r, Docker, Condition(false, "root"))
	if !r.failed {
		t.Fatal("Docker and another need missing under CI: want a failure")
	}
}
