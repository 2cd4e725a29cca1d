package service_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	harnessv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/harness/v1"
)

// TestContractCarriesNoCredentials: no message of the service's contract
// has a field that could carry a model API key or another credential (the
// pagination cursors excepted): keys are the service's configuration.
func TestContractCarriesNoCredentials(t *testing.T) {
	allowed := map[string]bool{"page_token": true, "next_page_token": true, "input_tokens": true, "output_tokens": true}
	suspicious := []string{"key", "secret", "token", "password", "credential", "auth", "base_url", "endpoint"}
	var visit func(md protoreflect.MessageDescriptor)
	seen := map[protoreflect.FullName]bool{}
	visit = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		for i := 0; i < md.Fields().Len(); i++ {
			f := md.Fields().Get(i)
			name := string(f.Name())
			if md.IsMapEntry() && name == "key" {
				continue // a map's key (labels, env), named by the map's field
			}
			for _, s := range suspicious {
				if strings.Contains(name, s) && !allowed[name] {
					t.Errorf("%s.%s may carry a credential", md.FullName(), name)
				}
			}
			if f.Message() != nil && strings.HasPrefix(string(f.Message().FullName()), "bulkhead.") {
				visit(f.Message())
			}
		}
	}
	n := 0
	for _, fd := range []protoreflect.FileDescriptor{harnessv1.File_bulkhead_harness_v1_run_proto, harnessv1.File_bulkhead_harness_v1_sandbox_proto} {
		for i := 0; i < fd.Messages().Len(); i++ {
			visit(fd.Messages().Get(i))
			n++
		}
	}
	if n < 20 {
		t.Fatalf("only %d messages visited", n)
	}
}
