package replay_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

// TestReplayFromStartPerConversation: with FromStart every conversation
// replays the script from its first turn, whatever other conversations
// did before, and one that comes back with its history goes on where it
// stopped; past the end it is told so.
func TestReplayFromStartPerConversation(t *testing.T) {
	srv := replay.NewServer()
	defer srv.Close()
	srv.DiscardRequests()
	srv.SetFallback(replay.FromStart(
		replay.Turn{Items: []replay.Item{replay.Message("Looking."), replay.FunctionCall("c1", "exec_command", `{"cmd":"ls"}`)}},
		replay.Turn{Items: []replay.Item{replay.Message("Done.")}},
	))
	ask := func(input string) (int, string) {
		t.Helper()
		res, err := http.Post(srv.URL()+"/responses", "application/json", strings.NewReader(`{"model":"m","input":`+input+`}`))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var body struct {
			Output []struct {
				Type    string
				Content []struct{ Text string }
			}
			Error struct{ Message string }
		}
		_ = json.NewDecoder(res.Body).Decode(&body)
		if res.StatusCode != http.StatusOK {
			return res.StatusCode, body.Error.Message
		}
		return res.StatusCode, body.Output[0].Content[0].Text
	}
	first := `[{"role":"user","content":"go"}]`
	second := `[{"role":"user","content":"go"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."}]},
		{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"a\n"}]`
	third := strings.TrimSuffix(second, "]") + `,{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Done."}]},{"role":"user","content":"more"}]`
	for i, c := range []struct {
		input string
		code  int
		want  string
	}{
		{first, 200, "Looking."}, {first, 200, "Looking."}, {second, 200, "Done."}, {first, 200, "Looking."},
		{third, 400, "the script has 2 turns"},
	} {
		if code, got := ask(c.input); code != c.code || !strings.Contains(got, c.want) {
			t.Errorf("request %d: %d %q, want %d %q", i+1, code, got, c.code, c.want)
		}
	}
	if n := len(srv.Requests()); n != 0 || srv.Err() != nil {
		t.Errorf("kept %d requests; err %v", n, srv.Err())
	}
}
