package replay_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/replay"
)

type sseEvent struct {
	name string
	data map[string]any
}

// post sends a raw request and parses the event stream.
func post(t *testing.T, url, body string) []sseEvent {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var evs []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data); err != nil {
				t.Fatal(err)
			}
		case line == "":
			evs = append(evs, cur)
			cur = sseEvent{}
		}
	}
	return evs
}

func TestStreamEventSequence(t *testing.T) {
	srv := replay.NewServer(replay.Turn{ChunkSize: 3, Items: []replay.Item{
		replay.Reasoning("rs_1", "enc", "why"),
		replay.Message("hello"),
		replay.FunctionCall("c1", "f", `{"a":1}`), // 7 bytes: 3 deltas
		replay.CustomToolCall("c2", "apply_patch", "patch"),
	}, Usage: replay.Usage{InputTokens: 3, OutputTokens: 4}})
	defer srv.Close()
	// The route without /v1 serves clients whose base URL has no version.
	evs := post(t, strings.TrimSuffix(srv.URL(), "/v1")+"/responses", `{"model":"m","stream":true,"input":"hi"}`)

	var names []string
	for i, ev := range evs {
		names = append(names, ev.name)
		if ev.data["type"] != ev.name {
			t.Errorf("event %d: type %v under event name %s", i, ev.data["type"], ev.name)
		}
		if ev.data["sequence_number"] != float64(i) {
			t.Errorf("event %d: sequence_number %v", i, ev.data["sequence_number"])
		}
	}
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added",
		"response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
		"response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
		"response.output_item.done",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added",
		"response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
		"response.output_item.added",
		"response.custom_tool_call_input.delta", "response.custom_tool_call_input.delta",
		"response.custom_tool_call_input.done", "response.output_item.done",
		"response.completed",
	}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	last := evs[len(evs)-1].data["response"].(map[string]any)
	if last["status"] != "completed" || len(last["output"].([]any)) != 4 {
		t.Errorf("final response = %v", last)
	}
	if u := last["usage"].(map[string]any); u["total_tokens"] != float64(7) {
		t.Errorf("usage = %v", u)
	}
	if r := srv.Requests()[0]; r.Path != "/responses" || len(r.Input()) != 1 || r.Input()[0]["content"] != "hi" {
		t.Errorf("recorded request = %+v", r)
	}
}

func TestNonStreamingWithOpenAIClient(t *testing.T) {
	srv := replay.NewServer(replay.Turn{ResponseID: "resp_x", Items: []replay.Item{
		replay.Reasoning("rs_9", "blob", "s1"),
		replay.FunctionCall("call_9", "exec_command", `{"cmd":"ls"}`),
		replay.CustomToolCall("call_10", "apply_patch", "*** Begin Patch\n*** End Patch\n"),
		replay.Message("bye"),
	}, Usage: replay.Usage{InputTokens: 10, CachedTokens: 2, OutputTokens: 5, ReasoningTokens: 3}})
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL()), option.WithAPIKey("k"), option.WithMaxRetries(0))
	res, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "gpt-test",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ID != "resp_x" || res.Status != "completed" || len(res.Output) != 4 {
		t.Fatalf("response = %+v", res)
	}
	if o := res.Output[0]; o.Type != "reasoning" || o.ID != "rs_9" || o.EncryptedContent != "blob" || o.Summary[0].Text != "s1" {
		t.Errorf("reasoning = %+v", o)
	}
	if o := res.Output[1]; o.CallID != "call_9" || o.Name != "exec_command" || o.Arguments.OfString != `{"cmd":"ls"}` {
		t.Errorf("function call = %+v", o)
	}
	if o := res.Output[2]; o.Type != "custom_tool_call" || o.Input != "*** Begin Patch\n*** End Patch\n" {
		t.Errorf("custom tool call = %+v", o)
	}
	if res.OutputText() != "bye" {
		t.Errorf("text = %q", res.OutputText())
	}
	u := res.Usage
	if u.InputTokens != 10 || u.InputTokensDetails.CachedTokens != 2 || u.OutputTokens != 5 ||
		u.OutputTokensDetails.ReasoningTokens != 3 || u.TotalTokens != 15 {
		t.Errorf("usage = %+v", u)
	}
}

func TestStreamingWithOpenAIClient(t *testing.T) {
	srv := replay.NewServer(replay.Turn{Items: []replay.Item{replay.Message("stream me")}})
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL()), option.WithAPIKey("k"), option.WithMaxRetries(0))
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model: "gpt-test", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	})
	defer stream.Close()
	var text strings.Builder
	var final responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.completed":
			final = ev.AsResponseCompleted().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "stream me" || final.OutputText() != "stream me" {
		t.Errorf("text %q final %q", text.String(), final.OutputText())
	}
}

func TestFaultsAndScriptExhaustion(t *testing.T) {
	srv := replay.NewServer(replay.RateLimited("3", "250"))
	defer srv.Close()
	res, err := http.Post(srv.URL()+"/responses", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Message, Type string }
	}
	_ = json.NewDecoder(res.Body).Decode(&body)
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "3" || res.Header.Get("retry-after-ms") != "250" ||
		res.Header.Get("x-request-id") != "req_1" || body.Error.Type != "rate_limit_exceeded" || body.Error.Message == "" {
		t.Errorf("429 answer: %d %v %+v", res.StatusCode, res.Header, body)
	}
	if srv.Err() != nil || srv.Remaining() != 0 {
		t.Fatalf("err %v remaining %d", srv.Err(), srv.Remaining())
	}

	res, err = http.Post(srv.URL()+"/responses", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 500 || srv.Err() == nil || !strings.Contains(srv.Err().Error(), "script exhausted") {
		t.Errorf("exhausted: status %d err %v", res.StatusCode, srv.Err())
	}
}

func TestResponderAndFallback(t *testing.T) {
	srv := replay.NewServer()
	defer srv.Close()
	srv.EnqueueFunc(func(r *replay.Request) replay.Turn {
		return replay.Turn{Items: []replay.Item{replay.Message("first saw " + r.Model())}}
	})
	srv.SetFallback(func(r *replay.Request) replay.Turn {
		return replay.Turn{Items: []replay.Item{replay.Message("fallback " + r.Instructions())}}
	})
	client := openai.NewClient(option.WithBaseURL(srv.URL()), option.WithAPIKey("k"), option.WithMaxRetries(0))
	for i, want := range []string{"first saw gpt-a", "fallback be nice", "fallback be nice"} {
		res, err := client.Responses.New(context.Background(), responses.ResponseNewParams{
			Model: "gpt-a", Instructions: openai.String("be nice"),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.OutputText() != want {
			t.Errorf("call %d: %q, want %q", i, res.OutputText(), want)
		}
	}
	if n := len(srv.Requests()); n != 3 || srv.Err() != nil {
		t.Errorf("requests %d err %v", n, srv.Err())
	}
}

func TestDroppedStreamCutsConnection(t *testing.T) {
	srv := replay.NewServer(replay.Turn{Items: []replay.Item{replay.Message("abcdefgh")}}.Dropped(3))
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL()), option.WithAPIKey("k"), option.WithMaxRetries(0))
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m"})
	n := 0
	for stream.Next() {
		n++
	}
	if n != 3 || stream.Err() == nil {
		t.Errorf("got %d events, err %v; want 3 and an error", n, stream.Err())
	}
}

func TestCloseReleasesStalledStream(t *testing.T) {
	srv := replay.NewServer(replay.Turn{Items: []replay.Item{replay.Message("abcdefgh")}}.Stalled(2))
	client := openai.NewClient(option.WithBaseURL(srv.URL()), option.WithAPIKey("k"), option.WithMaxRetries(0))
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m"})
	for i := 0; i < 2; i++ {
		if !stream.Next() {
			t.Fatalf("event %d missing: %v", i, stream.Err())
		}
	}
	srv.Close() // must not hang on the stalled handler
	if stream.Next() {
		t.Error("stream went on after the server closed")
	}
	_ = stream.Close()
}
