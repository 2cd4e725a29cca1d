package replay

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// obj is a JSON object on the wire.
type obj = map[string]any

// builder renders one turn as a response object and as its event stream.
type builder struct {
	turn  Turn
	id    string
	req   *Request
	items []obj // completed output items, in order
}

func newBuilder(t Turn, n int, req *Request) *builder {
	b := &builder{turn: t, id: t.ResponseID, req: req}
	b.turn.Items = append([]Item(nil), t.Items...)
	if b.id == "" {
		b.id = fmt.Sprintf("resp_%d", n)
	}
	for i, it := range b.turn.Items {
		if it.ID == "" {
			it.ID = fmt.Sprintf("%s_%d_%d", idPrefix(it.Type), n, i)
		}
		if it.Type == ItemFunctionCall && it.Arguments == "" {
			it.Arguments = "{}"
		}
		b.turn.Items[i] = it
		b.items = append(b.items, itemJSON(it, true))
	}
	return b
}

func idPrefix(t ItemType) string {
	switch t {
	case ItemFunctionCall:
		return "fc"
	case ItemCustomToolCall:
		return "ctc"
	case ItemReasoning:
		return "rs"
	case ItemCompaction:
		return "cmp"
	default:
		return "msg"
	}
}

// itemJSON renders an output item, complete or as first announced.
func itemJSON(it Item, done bool) obj {
	status := "completed"
	if !done {
		status = "in_progress"
	}
	switch it.Type {
	case ItemFunctionCall:
		args := it.Arguments
		if !done {
			args = ""
		}
		return obj{"id": it.ID, "type": "function_call", "status": status,
			"call_id": it.CallID, "name": it.Name, "arguments": args}
	case ItemCustomToolCall:
		in := it.Input
		if !done {
			in = ""
		}
		return obj{"id": it.ID, "type": "custom_tool_call", "status": status,
			"call_id": it.CallID, "name": it.Name, "input": in}
	case ItemReasoning:
		summary := []any{}
		if done {
			for _, s := range it.Summary {
				summary = append(summary, summaryPart(s))
			}
		}
		o := obj{"id": it.ID, "type": "reasoning", "summary": summary}
		if it.EncryptedContent != "" {
			o["encrypted_content"] = it.EncryptedContent
		}
		return o
	case ItemCompaction:
		return obj{"id": it.ID, "type": "compaction", "encrypted_content": it.EncryptedContent}
	default:
		content := []any{}
		if done {
			content = append(content, textPart(it.Text))
		}
		return obj{"id": it.ID, "type": "message", "role": "assistant", "status": status, "content": content}
	}
}

func textPart(s string) obj {
	return obj{"type": "output_text", "text": s, "annotations": []any{}, "logprobs": []any{}}
}

func summaryPart(s string) obj { return obj{"type": "summary_text", "text": s} }

// response renders the response object with the given status and output.
func (b *builder) response(status string, output []obj, withUsage bool) obj {
	out := make([]any, len(output))
	for i, o := range output {
		out[i] = o
	}
	r := obj{
		"id":                   b.id,
		"object":               "response",
		"created_at":           time.Now().Unix(),
		"status":               status,
		"error":                nil,
		"incomplete_details":   nil,
		"model":                b.req.Model(),
		"output":               out,
		"parallel_tool_calls":  true,
		"tool_choice":          "auto",
		"tools":                []any{},
		"store":                false,
		"text":                 obj{"format": obj{"type": "text"}},
		"truncation":           "disabled",
		"metadata":             obj{},
		"previous_response_id": nil,
		"temperature":          1,
		"top_p":                1,
	}
	for _, k := range []string{"instructions", "tools", "tool_choice", "parallel_tool_calls", "store", "text",
		"reasoning", "temperature", "top_p", "max_output_tokens", "metadata"} {
		if v, ok := b.req.Body[k]; ok {
			r[k] = v
		}
	}
	switch status {
	case "incomplete":
		r["incomplete_details"] = obj{"reason": b.turn.Incomplete}
	case "failed":
		msg := b.turn.Fault.Message
		if msg == "" {
			msg = "scripted failure: " + b.turn.Fault.FailCode
		}
		r["error"] = obj{"code": b.turn.Fault.FailCode, "message": msg}
	}
	if withUsage {
		u := b.turn.Usage
		r["usage"] = obj{
			"input_tokens":          u.InputTokens,
			"input_tokens_details":  obj{"cached_tokens": u.CachedTokens},
			"output_tokens":         u.OutputTokens,
			"output_tokens_details": obj{"reasoning_tokens": u.ReasoningTokens},
			"total_tokens":          u.InputTokens + u.OutputTokens,
		}
	}
	return r
}

func (b *builder) finalStatus() string {
	if f := b.turn.Fault; f != nil && f.FailCode != "" {
		return "failed"
	}
	if b.turn.Incomplete != "" {
		return "incomplete"
	}
	return "completed"
}

// final is the non-streaming answer.
func (b *builder) final() obj { return b.response(b.finalStatus(), b.items, true) }

// events is the streaming answer, numbered with sequence_number.
func (b *builder) events() []obj {
	var evs []obj
	add := func(typ string, o obj) {
		o["type"] = typ
		o["sequence_number"] = len(evs)
		evs = append(evs, o)
	}
	add("response.created", obj{"response": b.response("in_progress", nil, false)})
	add("response.in_progress", obj{"response": b.response("in_progress", nil, false)})
	size := b.turn.ChunkSize
	if size <= 0 {
		size = 4
	}
	for oi, it := range b.turn.Items {
		add("response.output_item.added", obj{"output_index": oi, "item": itemJSON(it, false)})
		at := func(o obj) obj { o["item_id"] = it.ID; o["output_index"] = oi; return o }
		switch it.Type {
		case ItemFunctionCall:
			for _, c := range chunks(it.Arguments, size) {
				add("response.function_call_arguments.delta", at(obj{"delta": c}))
			}
			add("response.function_call_arguments.done", at(obj{"name": it.Name, "arguments": it.Arguments}))
		case ItemCustomToolCall:
			for _, c := range chunks(it.Input, size) {
				add("response.custom_tool_call_input.delta", at(obj{"delta": c}))
			}
			add("response.custom_tool_call_input.done", at(obj{"input": it.Input}))
		case ItemReasoning:
			for si, s := range it.Summary {
				add("response.reasoning_summary_part.added", at(obj{"summary_index": si, "part": summaryPart("")}))
				for _, c := range chunks(s, size) {
					add("response.reasoning_summary_text.delta", at(obj{"summary_index": si, "delta": c}))
				}
				add("response.reasoning_summary_text.done", at(obj{"summary_index": si, "text": s}))
				add("response.reasoning_summary_part.done", at(obj{"summary_index": si, "part": summaryPart(s)}))
			}
		case ItemCompaction:
			// No deltas: the item arrives whole in output_item.added and
			// output_item.done.
		default:
			add("response.content_part.added", at(obj{"content_index": 0, "part": textPart("")}))
			for _, c := range chunks(it.Text, size) {
				add("response.output_text.delta", at(obj{"content_index": 0, "delta": c, "logprobs": []any{}}))
			}
			add("response.output_text.done", at(obj{"content_index": 0, "text": it.Text, "logprobs": []any{}}))
			add("response.content_part.done", at(obj{"content_index": 0, "part": textPart(it.Text)}))
		}
		add("response.output_item.done", obj{"output_index": oi, "item": b.items[oi]})
	}
	status := b.finalStatus()
	add("response."+status, obj{"response": b.response(status, b.items, true)})
	return evs
}

// chunks splits s into pieces of about size bytes without splitting a rune.
func chunks(s string, size int) []string {
	var out []string
	for len(s) > 0 {
		n := min(size, len(s))
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n++
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}
