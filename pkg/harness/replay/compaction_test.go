package replay_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

func TestCompactionItemStream(t *testing.T) {
	srv := replay.NewServer(replay.Turn{Items: []replay.Item{replay.Compaction("", "ENC"), replay.Message("hi")}})
	defer srv.Close()
	evs := post(t, srv.URL()+"/responses",
		`{"model":"m","stream":true,"input":"x","context_management":[{"type":"compaction","compact_threshold":5000}]}`)
	var names []string
	for _, ev := range evs {
		names = append(names, ev.name)
	}
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.completed",
	}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	item := map[string]any{"id": "cmp_1_0", "type": "compaction", "encrypted_content": "ENC"}
	for _, i := range []int{2, 3} {
		if got := evs[i].data["item"]; !reflect.DeepEqual(got, item) {
			t.Errorf("%s item = %v, want %v", evs[i].name, got, item)
		}
	}
	final := evs[len(evs)-1].data["response"].(map[string]any)
	if out := final["output"].([]any); len(out) != 2 || !reflect.DeepEqual(out[0], item) {
		t.Errorf("final output = %v", out)
	}

	r := srv.Requests()[0]
	if cm := r.ContextManagement(); len(cm) != 1 || cm[0]["type"] != "compaction" || cm[0]["compact_threshold"] != json.Number("5000") {
		t.Errorf("recorded context_management = %v", cm)
	}
	if n, ok := r.CompactThreshold(); !ok || n != 5000 {
		t.Errorf("threshold = %d, %v", n, ok)
	}
}

func TestCompactionItemWithOpenAIClient(t *testing.T) {
	srv := replay.NewServer(
		replay.Turn{Items: []replay.Item{replay.Compaction("cmp_7", "opaque"), replay.Message("bye")}},
		replay.Turn{Items: []replay.Item{replay.Compaction("cmp_8", "streamed")}},
	)
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL()), option.WithAPIKey("k"), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{
		Model: "gpt-test",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		ContextManagement: []responses.ResponseNewParamsContextManagement{
			{Type: "compaction", CompactThreshold: openai.Int(1000)},
		},
	}

	// JSON.
	res, err := client.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output) != 2 || res.OutputText() != "bye" {
		t.Fatalf("response = %+v", res)
	}
	c := res.Output[0].AsCompaction()
	if res.Output[0].Type != "compaction" || c.ID != "cmp_7" || c.EncryptedContent != "opaque" {
		t.Errorf("compaction = %+v", c)
	}

	// Server-sent events.
	stream := client.Responses.NewStreaming(context.Background(), params)
	defer stream.Close()
	var done []string
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "response.output_item.done" {
			it := ev.AsResponseOutputItemDone().Item
			done = append(done, it.Type+" "+it.ID+" "+it.EncryptedContent)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"compaction cmp_8 streamed"}; !reflect.DeepEqual(done, want) {
		t.Errorf("items done = %v, want %v", done, want)
	}

	for _, r := range srv.Requests() {
		if n, ok := r.CompactThreshold(); !ok || n != 1000 {
			t.Errorf("request %d: threshold %d, %v", r.N, n, ok)
		}
	}
}
