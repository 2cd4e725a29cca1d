package model

import (
	"encoding/json"
	"fmt"

	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// ContentRefusal is a refusal part of an assistant message.
const ContentRefusal ContentKind = "refusal"

// buildParams turns a request into the openai-go request body.
func buildParams(modelName string, req *Request) (responses.ResponseNewParams, error) {
	var p responses.ResponseNewParams
	if modelName == "" {
		return p, fmt.Errorf("model: invalid request: no model name (set Request.Model or Config.Model)")
	}
	p.Model = shared.ResponsesModel(modelName)
	p.Store = param.NewOpt(req.Settings.Store)
	if req.Instructions != "" {
		p.Instructions = param.NewOpt(req.Instructions)
	}

	input := make(responses.ResponseInputParam, 0, len(req.Input))
	for i, it := range req.Input {
		v, err := inputItem(it)
		if err != nil {
			return p, fmt.Errorf("model: invalid request: input item %d (%s): %w", i, it.Kind, err)
		}
		input = append(input, v)
	}
	p.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: input}

	kinds := make(map[string]ToolKind, len(req.Tools))
	for _, t := range req.Tools {
		v, err := toolParam(t)
		if err != nil {
			return p, fmt.Errorf("model: invalid request: tool %q: %w", t.Name, err)
		}
		if _, dup := kinds[t.Name]; dup {
			return p, fmt.Errorf("model: invalid request: tool %q defined twice", t.Name)
		}
		kinds[t.Name] = t.Kind
		p.Tools = append(p.Tools, v)
	}

	switch req.ToolChoice {
	case "":
	case "auto", "none", "required":
		p.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{
			OfToolChoiceMode: param.NewOpt(responses.ToolChoiceOptions(req.ToolChoice)),
		}
	default:
		switch kinds[req.ToolChoice] {
		case ToolFunction:
			p.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{
				OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: req.ToolChoice},
			}
		case ToolCustom:
			p.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{
				OfCustomTool: &responses.ToolChoiceCustomParam{Name: req.ToolChoice},
			}
		default:
			return p, fmt.Errorf("model: invalid request: tool choice %q names no tool of the request", req.ToolChoice)
		}
	}
	if req.ParallelToolCalls != nil {
		p.ParallelToolCalls = param.NewOpt(*req.ParallelToolCalls)
	}

	if o := req.Output; o != nil {
		schema, err := schemaMap(o.Schema)
		if err != nil {
			return p, fmt.Errorf("model: invalid request: output schema %q: %w", o.Name, err)
		}
		js := &responses.ResponseFormatTextJSONSchemaConfigParam{Name: o.Name, Schema: schema, Strict: param.NewOpt(o.Strict)}
		if o.Description != "" {
			js.Description = param.NewOpt(o.Description)
		}
		p.Text = responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{OfJSONSchema: js}}
	}

	for i, cm := range req.ContextManagement {
		if cm.Type == "" {
			return p, fmt.Errorf("model: invalid request: context management entry %d has no type", i)
		}
		if cm.CompactThreshold < 0 {
			return p, fmt.Errorf("model: invalid request: context management entry %d (%s): negative compact threshold %d",
				i, cm.Type, cm.CompactThreshold)
		}
		e := responses.ResponseNewParamsContextManagement{Type: cm.Type}
		if cm.CompactThreshold > 0 {
			e.CompactThreshold = param.NewOpt(cm.CompactThreshold)
		}
		p.ContextManagement = append(p.ContextManagement, e)
	}

	if r := req.Reasoning; r != nil {
		p.Reasoning = shared.ReasoningParam{
			Effort:  shared.ReasoningEffort(r.Effort),
			Summary: shared.ReasoningSummary(r.Summary),
		}
		if !req.Settings.Store {
			p.Include = []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent}
		}
	}

	s := req.Settings
	if s.Temperature != nil {
		p.Temperature = param.NewOpt(*s.Temperature)
	}
	if s.TopP != nil {
		p.TopP = param.NewOpt(*s.TopP)
	}
	if s.MaxOutputTokens > 0 {
		p.MaxOutputTokens = param.NewOpt(s.MaxOutputTokens)
	}
	if s.PromptCacheKey != "" {
		p.PromptCacheKey = param.NewOpt(s.PromptCacheKey)
	}
	if len(s.Metadata) > 0 {
		p.Metadata = shared.Metadata(s.Metadata)
	}
	return p, nil
}

func schemaMap(raw json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 {
		return map[string]any{"type": "object", "properties": map[string]any{}}, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("schema is not a JSON object: %w", err)
	}
	return m, nil
}

func toolParam(t Tool) (responses.ToolUnionParam, error) {
	if t.Name == "" {
		return responses.ToolUnionParam{}, fmt.Errorf("no name")
	}
	switch t.Kind {
	case ToolFunction:
		schema, err := schemaMap(t.Parameters)
		if err != nil {
			return responses.ToolUnionParam{}, err
		}
		f := &responses.FunctionToolParam{Name: t.Name, Parameters: schema, Strict: param.NewOpt(t.Strict)}
		if t.Description != "" {
			f.Description = param.NewOpt(t.Description)
		}
		return responses.ToolUnionParam{OfFunction: f}, nil
	case ToolCustom:
		c := &responses.CustomToolParam{Name: t.Name}
		if t.Description != "" {
			c.Description = param.NewOpt(t.Description)
		}
		if g := t.Grammar; g != nil {
			if g.Syntax != "lark" && g.Syntax != "regex" {
				return responses.ToolUnionParam{}, fmt.Errorf("grammar syntax %q (want lark or regex)", g.Syntax)
			}
			if g.Definition == "" {
				return responses.ToolUnionParam{}, fmt.Errorf("empty grammar definition")
			}
			c.Format = shared.CustomToolInputFormatUnionParam{
				OfGrammar: &shared.CustomToolInputFormatGrammarParam{Syntax: g.Syntax, Definition: g.Definition},
			}
		} else {
			c.Format = shared.CustomToolInputFormatUnionParam{OfText: &shared.CustomToolInputFormatTextParam{}}
		}
		return responses.ToolUnionParam{OfCustom: c}, nil
	}
	return responses.ToolUnionParam{}, fmt.Errorf("unknown tool kind %q", t.Kind)
}

func imageDetail(d string) string {
	if d == "" {
		return "auto"
	}
	return d
}

// messageContent renders input message parts (user, system, developer).
func messageContent(cs []Content) (responses.ResponseInputMessageContentListParam, error) {
	out := make(responses.ResponseInputMessageContentListParam, 0, len(cs))
	for _, c := range cs {
		switch c.Kind {
		case ContentText:
			out = append(out, responses.ResponseInputContentUnionParam{OfInputText: &responses.ResponseInputTextParam{Text: c.Text}})
		case ContentImage:
			img, err := imageParam(c)
			if err != nil {
				return nil, err
			}
			out = append(out, responses.ResponseInputContentUnionParam{OfInputImage: img})
		default:
			return nil, fmt.Errorf("content kind %q not allowed in an input message", c.Kind)
		}
	}
	return out, nil
}

func imageParam(c Content) (*responses.ResponseInputImageParam, error) {
	img := &responses.ResponseInputImageParam{Detail: responses.ResponseInputImageDetail(imageDetail(c.Detail))}
	switch {
	case c.ImageURL != "":
		img.ImageURL = param.NewOpt(c.ImageURL)
	case c.FileID != "":
		img.FileID = param.NewOpt(c.FileID)
	default:
		return nil, fmt.Errorf("image part with neither URL nor file id")
	}
	return img, nil
}

func inputItem(it Item) (responses.ResponseInputItemUnionParam, error) {
	var none responses.ResponseInputItemUnionParam
	switch it.Kind {
	case ItemMessage:
		return messageItem(it)
	case ItemFunctionCall:
		if it.CallID == "" || it.Name == "" {
			return none, fmt.Errorf("function call without call id or name")
		}
		v := responses.ResponseInputItemParamOfFunctionCall(it.Arguments, it.CallID, it.Name)
		if it.ID != "" {
			v.OfFunctionCall.ID = param.NewOpt(it.ID)
		}
		return v, nil
	case ItemCustomToolCall:
		if it.CallID == "" || it.Name == "" {
			return none, fmt.Errorf("custom tool call without call id or name")
		}
		v := responses.ResponseInputItemParamOfCustomToolCall(it.CallID, it.Input, it.Name)
		if it.ID != "" {
			v.OfCustomToolCall.ID = param.NewOpt(it.ID)
		}
		return v, nil
	case ItemFunctionCallOutput:
		if it.CallID == "" {
			return none, fmt.Errorf("function call output without call id")
		}
		out := &responses.ResponseInputItemFunctionCallOutputParam{CallID: param.NewOpt(it.CallID)}
		if len(it.Content) == 0 {
			out.Output.OfString = param.NewOpt(it.Output)
		} else {
			list := responses.ResponseFunctionCallOutputItemListParam{}
			for _, c := range it.Content {
				switch c.Kind {
				case ContentText:
					list = append(list, responses.ResponseFunctionCallOutputItemUnionParam{
						OfInputText: &responses.ResponseInputTextContentParam{Text: c.Text}})
				case ContentImage:
					img := &responses.ResponseInputImageContentParam{
						Detail: responses.ResponseInputImageContentDetail(imageDetail(c.Detail))}
					switch {
					case c.ImageURL != "":
						img.ImageURL = param.NewOpt(c.ImageURL)
					case c.FileID != "":
						img.FileID = param.NewOpt(c.FileID)
					default:
						return none, fmt.Errorf("image part with neither URL nor file id")
					}
					list = append(list, responses.ResponseFunctionCallOutputItemUnionParam{OfInputImage: img})
				default:
					return none, fmt.Errorf("content kind %q not allowed in a tool output", c.Kind)
				}
			}
			out.Output.OfResponseFunctionCallOutputItemArray = list
		}
		return responses.ResponseInputItemUnionParam{OfFunctionCallOutput: out}, nil
	case ItemCustomToolCallOutput:
		if it.CallID == "" {
			return none, fmt.Errorf("custom tool call output without call id")
		}
		out := &responses.ResponseCustomToolCallOutputParam{CallID: it.CallID}
		if len(it.Content) == 0 {
			out.Output.OfString = param.NewOpt(it.Output)
		} else {
			for _, c := range it.Content {
				switch c.Kind {
				case ContentText:
					out.Output.OfOutputContentList = append(out.Output.OfOutputContentList,
						responses.ResponseCustomToolCallOutputOutputOutputContentListItemUnionParam{
							OfInputText: &responses.ResponseInputTextParam{Text: c.Text}})
				case ContentImage:
					img, err := imageParam(c)
					if err != nil {
						return none, err
					}
					out.Output.OfOutputContentList = append(out.Output.OfOutputContentList,
						responses.ResponseCustomToolCallOutputOutputOutputContentListItemUnionParam{OfInputImage: img})
				default:
					return none, fmt.Errorf("content kind %q not allowed in a tool output", c.Kind)
				}
			}
		}
		return responses.ResponseInputItemUnionParam{OfCustomToolCallOutput: out}, nil
	case ItemReasoning:
		if it.ID == "" {
			return none, fmt.Errorf("reasoning item without id")
		}
		r := &responses.ResponseReasoningItemParam{ID: it.ID, Summary: []responses.ResponseReasoningItemSummaryParam{}}
		for _, s := range it.Summary {
			r.Summary = append(r.Summary, responses.ResponseReasoningItemSummaryParam{Text: s})
		}
		for _, s := range it.ReasoningText {
			r.Content = append(r.Content, responses.ResponseReasoningItemContentParam{Text: s})
		}
		if it.EncryptedContent != "" {
			r.EncryptedContent = param.NewOpt(it.EncryptedContent)
		}
		return responses.ResponseInputItemUnionParam{OfReasoning: r}, nil
	case ItemCompaction:
		if it.EncryptedContent == "" {
			return none, fmt.Errorf("compaction item without encrypted content")
		}
		v := responses.ResponseInputItemParamOfCompaction(it.EncryptedContent)
		if it.ID != "" {
			v.OfCompaction.ID = param.NewOpt(it.ID)
		}
		return v, nil
	}
	return none, fmt.Errorf("unknown item kind")
}

func messageItem(it Item) (responses.ResponseInputItemUnionParam, error) {
	var none responses.ResponseInputItemUnionParam
	switch it.Role {
	case RoleAssistant:
		if it.ID == "" {
			// An assistant message the caller wrote (not model output).
			return responses.ResponseInputItemParamOfMessage(it.Text(), responses.EasyInputMessageRoleAssistant), nil
		}
		m := &responses.ResponseOutputMessageParam{ID: it.ID, Status: responses.ResponseOutputMessageStatusCompleted}
		for _, c := range it.Content {
			switch c.Kind {
			case ContentText:
				m.Content = append(m.Content, responses.ResponseOutputMessageContentUnionParam{
					OfOutputText: &responses.ResponseOutputTextParam{Text: c.Text, Annotations: []responses.ResponseOutputTextAnnotationUnionParam{}}})
			case ContentRefusal:
				m.Content = append(m.Content, responses.ResponseOutputMessageContentUnionParam{
					OfRefusal: &responses.ResponseOutputRefusalParam{Refusal: c.Text}})
			default:
				return none, fmt.Errorf("content kind %q not allowed in an assistant message", c.Kind)
			}
		}
		return responses.ResponseInputItemUnionParam{OfOutputMessage: m}, nil
	case RoleUser, RoleSystem, RoleDeveloper, "":
		role := it.Role
		if role == "" {
			role = RoleUser
		}
		if len(it.Content) == 1 && it.Content[0].Kind == ContentText {
			return responses.ResponseInputItemParamOfMessage(it.Content[0].Text, responses.EasyInputMessageRole(role)), nil
		}
		content, err := messageContent(it.Content)
		if err != nil {
			return none, err
		}
		return responses.ResponseInputItemParamOfMessage(content, responses.EasyInputMessageRole(role)), nil
	}
	return none, fmt.Errorf("unknown role %q", it.Role)
}

// outputItem converts a model output item; ok is false for item types the
// harness does not use (hosted tools).
func outputItem(o responses.ResponseOutputItemUnion) (Item, bool) {
	switch o.Type {
	case "message":
		it := Item{Kind: ItemMessage, ID: o.ID, Role: RoleAssistant}
		if o.Role != "" {
			it.Role = o.Role
		}
		for _, c := range o.Content {
			switch c.Type {
			case "output_text":
				it.Content = append(it.Content, TextContent(c.Text))
			case "refusal":
				it.Content = append(it.Content, Content{Kind: ContentRefusal, Text: c.Refusal})
			}
		}
		return it, true
	case "function_call":
		return Item{Kind: ItemFunctionCall, ID: o.ID, CallID: o.CallID, Name: o.Name, Arguments: o.Arguments.OfString}, true
	case "custom_tool_call":
		return Item{Kind: ItemCustomToolCall, ID: o.ID, CallID: o.CallID, Name: o.Name, Input: o.Input}, true
	case "reasoning":
		it := Item{Kind: ItemReasoning, ID: o.ID, EncryptedContent: o.EncryptedContent}
		for _, s := range o.Summary {
			it.Summary = append(it.Summary, s.Text)
		}
		for _, c := range o.Content {
			if c.Type == "reasoning_text" {
				it.ReasoningText = append(it.ReasoningText, c.Text)
			}
		}
		return it, true
	case "compaction":
		return Item{Kind: ItemCompaction, ID: o.ID, EncryptedContent: o.EncryptedContent}, true
	}
	return Item{}, false
}

// usageOf converts the API's usage block.
func usageOf(u responses.ResponseUsage) Usage {
	return Usage{
		Requests:          1,
		InputTokens:       u.InputTokens,
		CachedInputTokens: u.InputTokensDetails.CachedTokens,
		OutputTokens:      u.OutputTokens,
		ReasoningTokens:   u.OutputTokensDetails.ReasoningTokens,
		TotalTokens:       u.TotalTokens,
	}
}
